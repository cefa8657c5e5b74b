"""Solves: the router ``blocklin.solve`` (Tikhonov least squares and its lambda rules), the square
solves (LU, Cholesky), the stored-Gram route, triangular solves and the normal-equation kernels."""
