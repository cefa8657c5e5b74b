"""blocklin: out-of-core blocked linear algebra on chunked zarr matrices.

Matrices live on disk as zarr arrays; a Dask graph schedules tiles; each tile task streams its
operands through the compute device (NumPy/BLAS with prefetching on a CPU, CuPy streams on a GPU).
"""

from blocklin._version import __version__
from blocklin import _memory, config, errors  # noqa: E402

_memory.tune_on_import()

from blocklin.config import configure  # noqa: E402
from blocklin.create import from_array, from_sparse, open, random  # noqa: E402,A004
from blocklin.linalg.factor.cholesky import cholesky  # noqa: E402
from blocklin.linalg.products.gemm import matmul, matmul_plan  # noqa: E402
from blocklin.linalg.products.gram import gram  # noqa: E402
from blocklin.linalg.inverse.inverse import inv, inv_plan  # noqa: E402
from blocklin.linalg.factor.lu import lu  # noqa: E402
from blocklin.linalg.lowrank.eigsh import eigsh  # noqa: E402
from blocklin.linalg.operator import aslinearoperator  # noqa: E402
from blocklin.linalg.lowrank.pca import pca  # noqa: E402
from blocklin.linalg.interop.norms import cond, det, norm, slogdet  # noqa: E402
from blocklin.linalg.interop import numpy_protocol  # noqa: E402,F401 - NumPy's protocols on Matrix
from blocklin.linalg.factor.qr import qr  # noqa: E402
from blocklin.linalg.lowrank.svd import svd  # noqa: E402
from blocklin.linalg.solve.factored import cho_solve, lu_solve  # noqa: E402
from blocklin.linalg.solve.lstsq import lstsq  # noqa: E402
from blocklin.linalg.solve.router import solve, solve_plan  # noqa: E402
from blocklin.linalg.solve.triangular import solve_triangular  # noqa: E402
from blocklin.linalg.update import update  # noqa: E402
from blocklin.matrix import Matrix  # noqa: E402
from blocklin.sparse import SparseMatrix  # noqa: E402
from blocklin.storage.append import append, rollback as rollback_append  # noqa: E402
from blocklin.storage.convert import convert  # noqa: E402

__all__ = [
    "Matrix", "SparseMatrix", "__version__", "append", "aslinearoperator", "cho_solve", "cholesky", "cond", "config",
    "configure", "convert", "det", "eigsh", "errors", "from_array", "from_sparse", "gram", "inv", "inv_plan", "lstsq",
    "lu", "lu_solve", "matmul", "matmul_plan", "norm", "open", "pca", "qr", "random", "rollback_append", "slogdet",
    "solve", "solve_plan", "solve_triangular", "svd", "update",
]
