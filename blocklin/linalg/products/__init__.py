"""Products of stored matrices: the blocked GEMM (``blocklin.matmul``) and the Gram (``blocklin.gram``)."""
