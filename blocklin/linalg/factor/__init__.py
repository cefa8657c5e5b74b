"""Factorizations of stored matrices (``blocklin.cholesky``, ``blocklin.lu``, ``blocklin.qr``) and
their tile and panel numerics (Cholesky tiles, LU panels, Householder panels, the tile QR)."""
