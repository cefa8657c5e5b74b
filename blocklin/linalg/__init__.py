"""Algorithms written as sequences of passes, block operations and small in-core steps.

Seven rooms on three floors; a room imports only from its own floor or below:

* ``blocks`` (floor 1): the shared tall-block toolbox (random test matrices, TSQR and the streaming
  QR, orthonormalization, tall blocks, centering moments, scaling, SYRK helpers, the tall-block
  row-pass kernels, stored result groups).
* ``products``, ``factor`` (floor 2): GEMM and the Gram; Cholesky, LU and QR with their tile and
  panel numerics.
* ``solve``, ``inverse``, ``lowrank`` (floor 3): least squares and square solves; the inverse;
  SVD, Lanczos, eigsh and PCA.

``operator`` (a SciPy ``LinearOperator`` over a stored matrix) stands beside them on the first floor.
"""
