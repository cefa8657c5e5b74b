"""One error hierarchy for blocklin.

Every error subclasses :class:`BlocklinError` and the closest builtin, so callers can catch either
``blocklin.errors.ShapeError`` or plain ``ValueError``. Messages name the parameter, the rule, the
actual values and a fix; build them with :func:`explain` for a uniform shape.
"""

from __future__ import annotations

import warnings

import numpy as np


class BlocklinError(Exception):
    """Base class of every error raised by blocklin."""


class ParameterError(BlocklinError, ValueError):
    """An argument of an operation is invalid (out of range, unknown choice, wrong kind)."""


class ConfigError(BlocklinError, ValueError):
    """A configuration value (budget, device, scheduler, codec, ...) is invalid."""


class ShapeError(BlocklinError, ValueError):
    """Operand shapes do not agree (blocklin never broadcasts)."""


class DTypeError(BlocklinError, TypeError):
    """Operand dtypes are unsupported or do not agree."""


class NonFiniteError(BlocklinError, ValueError):
    """An operand holds NaN or Inf while ``check_finite`` is on."""


class MatrixIndexError(BlocklinError, IndexError):
    """An index into a :class:`~blocklin.Matrix` is out of range or of a kind it cannot read (NumPy's
    ``IndexError``: ``list(m)`` and ``for row in m`` stop on it as on an array)."""


class BudgetError(BlocklinError, MemoryError):
    """The memory budget cannot hold even the smallest plan.

    ``minimum`` is the smallest budget (bytes) the failing step needs, when it knows it: drivers
    that plan several steps add them up so that the budget a message suggests is sufficient.
    """

    def __init__(self, message: str = "", minimum: int | None = None) -> None:
        super().__init__(message)
        self.minimum = minimum

    def __reduce__(self) -> tuple:  # keeps ``minimum`` across process boundaries
        return (type(self), (str(self), self.minimum))


class StoreNotFoundError(BlocklinError, FileNotFoundError):
    """A path does not hold a readable matrix store."""


class StoreReadError(BlocklinError, OSError):
    """A store exists but cannot be read (corrupt, truncated, wrong format)."""


class UncommittedOutputError(StoreReadError):
    """A store is an output that an interrupted job left unfinished (resume or remove it)."""


class StorageUnreachableError(BlocklinError, ConnectionError):
    """The storage endpoint (an S3 server, ...) cannot be reached; what is stored there is kept."""


class StorageCredentialsError(BlocklinError, PermissionError):
    """An object store was reached without credentials (none configured, or incomplete)."""


class DiskSpaceError(BlocklinError, OSError):
    """A store would not fit the free space of its destination, or the destination is not writable."""


class StorageBackendError(BlocklinError, ValueError):
    """A storage URL names an unknown protocol, or its fsspec backend is not installed."""


class TempDirError(BlocklinError, ValueError):
    """The temp dir cannot hold the job's intermediates where every worker can reach them."""


class FormatError(BlocklinError, ValueError):
    """A matrix file is malformed or mislabeled."""


class OutputExistsError(BlocklinError, FileExistsError):
    """The output exists and ``overwrite`` was not given."""


class OutputBusyError(OutputExistsError):
    """Another run that is still alive is writing the same output (or owns the work folder)."""


class InputChangedError(BlocklinError, RuntimeError):
    """An input was rewritten while a run read it: the result would mix its old and new values, so
    nothing is committed."""


class OutputIsInputError(BlocklinError, ValueError):
    """The output path is one of the inputs."""


class ArgumentTypeError(BlocklinError, TypeError):
    """An argument of a kind blocklin cannot take (a storage name that is neither a path, a URL nor a store)."""


class InternalError(BlocklinError, RuntimeError):
    """A broken internal invariant: a bug in blocklin, not in the input (please report it with the message)."""


class DeviceError(BlocklinError, RuntimeError):
    """The requested compute device is not available."""


class SingularMatrixError(BlocklinError, np.linalg.LinAlgError):
    """The matrix is singular or numerically singular."""


class NotSquareError(ShapeError, np.linalg.LinAlgError):
    """A square matrix was asked for where NumPy raises ``LinAlgError`` ("must be square"): caught as either."""


class NotPositiveDefiniteError(SingularMatrixError):
    """A Cholesky factorization met a pivot <= 0: the matrix is not symmetric positive definite.

    ``pivot`` is the global row/column index of the failing pivot (None when unknown). The message
    suggests a ridge (``lam=``) or a solver for general matrices (``assume_a="gen"``).
    """

    def __init__(self, message: str, pivot: int | None = None) -> None:
        super().__init__(message)
        self.pivot = pivot

    def __reduce__(self) -> tuple:  # keeps ``pivot`` across process boundaries
        return (type(self), (str(self), self.pivot))


class NotSymmetricError(BlocklinError, ValueError):
    """A symmetric matrix was required (``eigsh``) and the operand is not symmetric."""


class ConvergenceError(BlocklinError, RuntimeError):
    """An iterative method did not reach its tolerance within its limits."""


class WorkerLostError(BlocklinError, RuntimeError):
    """Worker processes died mid-job more often than the retries allow.

    The finished tiles of the output are kept, so a rerun with ``resume=True`` completes the job.
    """


class BlocklinWarning(UserWarning):
    """Base class of blocklin warnings."""


class ConvergenceWarning(BlocklinWarning):
    """An iterative method stopped before reaching its tolerance; the result is still returned."""


class IllConditionedWarning(BlocklinWarning):
    """A solution with a small backward error whose matrix is too ill-conditioned for it to carry a
    correct digit (``cond(A) eps >= 1``): SciPy's ``LinAlgWarning`` from ``scipy.linalg.solve``."""


def explain(what: str, rule: str, actual: str, fix: str) -> str:
    """Build an error message: ``"<what>: <rule>; got <actual>. Fix: <fix>"``."""
    return f"{what}: {rule}; got {actual}. Fix: {fix}"


def warn(message: str, category: type[Warning] = BlocklinWarning, stacklevel: int = 3) -> None:
    """Emit a blocklin warning from the caller's frame."""
    warnings.warn(message, category, stacklevel=stacklevel)
