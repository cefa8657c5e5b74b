"""blocklin: out-of-core blocked linear algebra on chunked zarr matrices.

Matrices live on disk as zarr arrays; a Dask graph schedules tiles; each tile task streams its
operands through the compute device (NumPy/BLAS with prefetching on a CPU, CuPy streams on a GPU).
"""

__version__ = "0.1.0"
