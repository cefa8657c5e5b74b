"""Solves: ``blocklin.solve`` (``router``) and its routes: the in-memory Tikhonov least squares
(``least_squares`` over ``tikhonov``, ``normal``, ``qr_route``, ``wide``, ``spectrum``), the stored Gram
matrix (``stored_gram``), the square systems (``square``), a stored sparse matrix by LSQR
(``sparse_lsqr``); one report builder (``report``); triangular
solves, the lambda rules and the normal equations' pass kernels."""
