"""Residual estimates and Newton-Schulz refinement of an approximate inverse, out of core.

Definitions used in every report
--------------------------------
``residual``
    ``||I - M X||_F``, either *exact* (computed tile by tile during a Newton-Schulz step) or
    *probed*: ``||P - M (X P)||_F / sqrt(k)`` with ``k = 32`` standard normal probe vectors ``P``, an
    unbiased estimate of ``||I - M X||_F^2`` in square (relative spread about ``sqrt(2/k) = 0.25``) that costs
    one pass over ``X`` (for ``X P``) and one over ``M``.
``backward_error``
    ``||I - M X||_F / (||M||_F ||X||_F)``, the normwise residual of an inverse (Du Croz and Higham,
    1992); a backward stable inversion makes it a small multiple of the unit roundoff whatever the
    condition number, whereas ``||I - M X||`` itself grows like ``cond(M) * eps``.

Newton-Schulz (Schulz 1933; Pan and Schreiber 1991): ``X <- X (2I - M X) = X + X R`` with
``R = I - M X`` converges quadratically (``R <- R^2``) whenever ``||R|| < 1``. One step is two
out-of-core GEMMs (``4 n^3`` flops, twice a whole inversion), so :func:`blocklin.inv` only steps
when the cheap probed estimate says the tolerance is not met.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from blocklin.errors import ConvergenceWarning, ParameterError, SingularMatrixError, warn
from blocklin.errors import explain as _msg
from blocklin.linalg.inverse.kernels import PROBES, InverseEpilogue, probe_kernel, products_kernel, transform_device, wide
from blocklin.linalg.blocks.random import probes
from blocklin.linalg.blocks.scaling import safe_norm
from blocklin.operands import Operand
from blocklin.runtime.blockops import BlockOps, Region, plan_block_gemm
from blocklin.runtime.passes import collect_rows, run_pass, source, stored
from blocklin.runtime.stages import Stages
from blocklin.storage.zarr_store import read_kind


def default_tol(n: int, dtype: Any, *, in_core: bool = False) -> float:
    """Default backward-error target: what LAPACK's pivoted inverse (``numpy.linalg.inv``) gives.

    In core (one pivoted LU leaf, no recursion) the result *is* LAPACK's inverse, so the target is the
    classical bound ``n eps`` (at least ``16 eps``) that only a failure would miss. Out of core the
    block recursion leaves a backward error 10 to 1000 times LAPACK's (the unpivoted block elimination
    loses accuracy with the condition of the leading blocks), and the forward error
    ``||X - A^-1|| / ||A^-1||`` follows the backward error; the target is then the unit roundoff
    ``eps / 2``, which one Newton-Schulz step reaches (it squares the residual): the forward error
    is then that of LAPACK's inverse or better.
    """
    eps = float(np.finfo(np.dtype(dtype)).eps)
    return max(16, n) * eps if in_core else eps / 2


#: A probed residual below this vouches for ``||I - M X||_F < 1``. With Gaussian probes the squared
#: estimate is ``||R||_F^2 chi2_k / k`` at worst (a rank-one ``R``), so a true ``||R||_F >= 1``
#: reads below 0.1 with probability ``P(chi2_32 < 0.32)``, under 1e-25.
PROBED_SAFE_RESIDUAL = 0.1


def is_inverse(residual: float, method: str) -> bool:
    """Whether ``X`` is verified to be an inverse of ``M``: ``||I - M X||_F < 1``.

    ``||R||_2 <= ||R||_F < 1`` makes ``M X`` nonsingular and bounds the relative forward error,
    ``||X - M^-1|| <= ||M^-1|| ||R||``; a singular ``M`` has ``||I - M X||_2 >= 1`` for every ``X``
    (the left null vector ``y`` gives ``y^T R = y^T``), whatever the normalised backward error says.
    An exact residual decides; a probed one vouches only when far below 1 (:data:`PROBED_SAFE_RESIDUAL`).
    """
    bound = 1.0 if method == "exact" else PROBED_SAFE_RESIDUAL
    return bool(np.isfinite(residual)) and residual < bound


def backward_error(residual: float, norm_m: float, norm_x: float) -> float:
    """``residual / (||M||_F ||X||_F)`` (``inf`` when a norm is zero or not finite)."""
    den = norm_m * norm_x
    if not (np.isfinite(residual) and np.isfinite(den)) or den == 0.0:
        return float("inf")
    return residual / den


def probe_estimate(job: Any, m: Any, w: np.ndarray, seed: int, *, description: str = "residual probe") -> float:
    """``||P - M W||_F / sqrt(k)`` for ``W = X P``: one row pass over ``M``; estimates ``||I - M X||_F``."""
    n, k = w.shape
    states, _ = run_pass(job, probe_kernel, [source(m, name="a")], {"w": w, "seed": seed, "n": n},
                         check_finite=False, description=description, device=probe_device(job, n))
    return math.sqrt(sum(s["sumsq"] for s in states) / k)


def probe_device(job: Any, n: int) -> str:
    """Where the probe passes run: as asked, or for ``auto`` where they win (``2 k`` flops per entry
    read with ``k`` = :data:`PROBES`: read-bound, so the CPU)."""
    return transform_device(job.cfg.device, n, 2.0 * PROBES, job.device)


def probe_products(job: Any, x: Any, n: int, dtype: Any, chunk: int, seed: int) -> np.ndarray:
    """``X P`` (``n x k``, float64; complex128 of complex ``X``) by one row pass over the stored ``X``:
    each task sends back only its rows."""
    src = stored(x, (n, n), dtype, (chunk, chunk), name="x")
    states, _ = run_pass(job, products_kernel, [src], {"n": n, "k": PROBES, "seed": seed}, check_finite=False,
                         over="intermediate", description="probe products X P")
    if np.dtype(dtype).kind != "c":
        return collect_rows(states, n, PROBES)
    out = np.empty((n, PROBES), dtype=wide(dtype))
    for st in states:
        for r0, blk in st["blocks"]:
            out[r0:r0 + blk.shape[0]] = blk
    return out


def plan_products(job: Any, m: Any, n: int, chunk: int, dtype: Any, memory: int) -> None:
    """The refinement's products planned at ``memory`` before anything is read, as :meth:`BlockOps.gemm`
    will plan them (:func:`ns_residual` reads ``M`` at its own chunks; :func:`ns_update`'s plan, with its
    ``C``, covers :func:`ns_product`'s): a refinement is decided only after the inversion, which a
    product refused then would have wasted."""
    from blocklin.operands import temp_store_reads

    work = temp_store_reads(job.cfg)
    plan_block_gemm(job, chunk, n, n, n, dtype=dtype, a_dtype=m.dtype, memory=memory, chunks={"a": tuple(m.chunks)},
                    reads=(read_kind(m.path), work))
    plan_block_gemm(job, chunk, n, n, n, dtype=dtype, with_c=True, memory=memory, reads=(work, work, work))


def ns_residual(ops: BlockOps, m: Any, x: str, r: str, n: int, dtype: Any) -> float:
    """``R = I - M X`` into store ``r``; returns the exact ``||R||_F``."""
    res = ops.gemm(r, (0, 0), n, n, n, m.path, (0, 0), x, (0, 0), dtype=dtype, a_dtype=m.dtype, alpha=-1.0,
                   epilogue=InverseEpilogue(identity=True), chunks={"a": tuple(m.chunks)},
                   description="Newton-Schulz: R = I - M X")
    return math.sqrt(sum(t["sumsq"] for t in res))


def ns_update(ops: BlockOps, x: str, r: str, x_new: str, n: int, dtype: Any) -> float:
    """``X_new = X + X R`` (the Newton-Schulz step); returns ``||X_new||_F``."""
    res = ops.gemm(x_new, (0, 0), n, n, n, x, (0, 0), r, (0, 0), dtype=dtype, c=x, beta=1.0,
                   epilogue=InverseEpilogue(), description="Newton-Schulz: X + X R")
    return safe_norm(ops, Region.of(x_new, (n, n)), sum(t["sumsq"] for t in res))


def ns_product(ops: BlockOps, x: str, z: str, out: str, n: int, dtype: Any) -> float:
    """``out = X Z`` (the preconditioned restart ``X (M X)^-1``); returns ``||out||_F``."""
    res = ops.gemm(out, (0, 0), n, n, n, x, (0, 0), z, (0, 0), dtype=dtype, epilogue=InverseEpilogue(),
                   description="restart: X (M X)^-1")
    return math.sqrt(sum(t["sumsq"] for t in res))


# -- the refinement loop -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Steps:
    """How many Newton-Schulz steps to take: at least ``least``, at most ``most``; ``exact``: exactly
    ``most`` whatever the tolerance (``refine=N``)."""

    least: int
    most: int
    exact: bool = False


@dataclasses.dataclass
class Iterate:
    """An approximate inverse in store ``path``: its residual ``||I - M X||_F`` (probed or exact),
    backward error and ``||X||_F``."""

    path: Any
    res: float
    eta: float
    method: str
    norm_x: float


class NewtonSchulz:
    """Newton-Schulz steps on a stored inverse (every step a recorded stage, see :class:`Stages`).

    Each round forms the exact ``R = I - M X`` (one GEMM); a converging iterate takes a step
    ``X + X R`` (probed afterwards); a residual ``>= sqrt(n)`` (Newton-Schulz cannot converge)
    takes one preconditioned restart ``X (M X)^-1`` instead (``invert(operand, out, seed)`` inverts
    ``M X = I - R`` the way the first inverse was made). Under a tolerance (``refine="auto"`` or
    ``True``) a step that does not lower the backward error is undone and stagnation stops; with
    ``refine=N`` exactly ``N`` steps are taken, and only a diverging step (residual grown past the
    previous one and past :data:`PROBED_SAFE_RESIDUAL`) is undone. The iterates alternate between the output and one spare store.
    """

    def __init__(self, ops: BlockOps, stages: Stages, M: Any, *, n: int, chunk: int, dtype: np.dtype, seed: int,
                 tol: float, steps: Steps, norm_m: float, x: Iterate, invert: Callable) -> None:
        self.ops, self.stages, self.M, self.n, self.chunk, self.dtype = ops, stages, M, n, chunk, dtype
        self.seed, self.tol, self.want, self.norm_m, self.x, self.invert = seed, tol, steps, norm_m, x, invert
        self.history: list[dict] = []
        self.steps = self.restarts = self.gemms = 0
        self.spare: Any = None
        self.log("inverse")

    def log(self, stage: str, x: Iterate | None = None) -> None:
        x = x or self.x
        self.history.append({"stage": stage, "residual": x.res, "backward_error": x.eta, "method": x.method})

    def store(self, name: str) -> Any:
        return self.stages.store(name, (self.n, self.n), self.dtype, (self.chunk, self.chunk))

    def probed(self, path: Any, seed: int, norm_x: float) -> Iterate:
        job, M = self.ops.job, self.M
        xp = self.stages.run("probe products", lambda: probe_products(job, path, self.n, self.dtype, self.chunk, seed))
        res = self.stages.run("probe", lambda: probe_estimate(job, M, xp, seed))
        return Iterate(path, res, backward_error(res, self.norm_m, norm_x), "probed", norm_x)

    def exact(self) -> Any:
        """``R = I - M X`` into a new store (returned); the iterate's residual becomes exact."""
        r_path, x = self.store("r"), self.x
        self.gemms += 1
        res = self.stages.run("residual", lambda: ns_residual(self.ops, self.M, x.path, r_path, self.n, self.dtype))
        self.x = Iterate(x.path, res, backward_error(res, self.norm_m, x.norm_x), "exact", x.norm_x)
        return r_path

    def converged(self) -> bool:
        x = self.x
        return not self.want.exact and x.eta <= self.tol and self.steps >= self.want.least and \
            is_inverse(x.res, x.method)

    def wanted(self) -> bool:
        x = self.x
        if self.steps >= self.want.most or not np.isfinite(x.eta):
            return False
        return self.want.exact or not self.converged()

    def run(self) -> None:
        while self.wanted():
            r_path = self.exact()
            self.log(f"residual {self.steps}")
            if self.converged():
                break
            if self.x.res >= math.sqrt(self.n):
                # ||R||_2 >= ||R||_F / sqrt(n) >= 1: Newton-Schulz would not converge. The block
                # recursion lost too much to ill-conditioning; M X is far better conditioned than M,
                # so invert it the same way and take X (M X)^-1 (a preconditioned restart, 3x the work).
                if self.restarts >= 1:
                    break
                self.restart(r_path)
                continue
            if not self.step(r_path):
                break

    def spare_store(self) -> Any:
        if self.spare is None:
            self.spare = self.store("x")
        return self.spare

    def restart(self, r_path: Any) -> None:
        """``X (M X)^-1``, with ``(M X)^-1 = (I - R)^-1`` inverted the same way; kept when better."""
        self.restarts += 1
        ops, n, dt, x = self.ops, self.n, self.dtype, self.x
        z_path = self.store("z")
        pm = Operand(name="I - R", path=r_path, shape=(n, n), dtype=dt, chunks=(self.chunk,) * 2)
        self.invert(pm, z_path, self.seed + 17)
        spare = self.spare_store()
        self.gemms += 1
        norm_new = self.stages.run("restart", lambda: ns_product(ops, x.path, z_path, spare, n, dt))
        Stages.drop(z_path)
        Stages.drop(r_path)
        new = self.probed(spare, self.seed + 31, norm_new)
        self.log("preconditioned restart X (M X)^-1", new)
        if new.eta < self.x.eta:
            self.spare, self.x = self.x.path, new

    def step(self, r_path: Any) -> bool:
        """``X + X R`` into the spare store; returns whether to go on."""
        prev = self.x
        nxt = self.spare_store()
        pseed = self.seed + self.steps + 1
        self.gemms += 1
        norm_x = self.stages.run("step", lambda: ns_update(self.ops, prev.path, r_path, nxt, self.n, self.dtype))
        Stages.drop(r_path)
        self.spare = prev.path
        self.steps += 1
        self.x = self.probed(nxt, pseed, norm_x)
        self.log(f"step {self.steps}")
        # under a tolerance: any step that does not help (||R||_2 >= 1, or the rounding floor) is
        # undone; asked for N steps: only a diverging one (the residual grew and is no longer small;
        # at the rounding floor the estimates only scatter)
        if self.want.exact:
            worse = not np.isfinite(self.x.eta) or self.x.res > max(prev.res, PROBED_SAFE_RESIDUAL)
        else:
            worse = not self.x.eta < prev.eta
        if worse:
            new, self.spare, self.x = self.x, nxt, prev
            self.log("kept the previous iterate")
            if self.want.exact:
                warn(f"inv: Newton-Schulz step {self.steps} raised the residual ||I - A X||_F from {prev.res:.2e} to "
                     f"{new.res:.2e} (||I - A X||_2 >= 1: it diverges); the previous iterate is returned",
                     ConvergenceWarning)
            return False
        return self.want.exact or not (self.x.eta > 0.5 * prev.eta and self.x.eta > self.tol)

    def accept(self, precision: str | None) -> None:
        """Return only a verified inverse (``||I - M X||_F < 1``): refuse a singular ``M``, warn above ``tol``."""
        if np.isfinite(self.x.eta) and self.x.method == "probed" and not is_inverse(self.x.res, "probed"):
            # the probes cannot vouch for X: decide on the exact residual (one GEMM), at every budget
            Stages.drop(self.exact())
            self.log("acceptance")
        x = self.x
        cond_est = self.norm_m * x.norm_x
        eps = float(np.finfo(self.dtype).eps)
        if is_inverse(x.res, x.method) and not (0 < self.norm_m < np.inf and 0 < x.norm_x < np.inf):
            # ||I - A X|| vouches for X, but ||A||_F or ||X||_F left float64's range (their sums of squares
            # overflow or underflow for entries beyond about 2^+-500): the backward error is unknown
            raise ParameterError(_msg(
                "a", "must have ||A||_F and ||A^-1||_F within float64's range (their squares are summed)",
                f"||A||_F = {self.norm_m:.1e}, ||X||_F = {x.norm_x:.1e} with ||I - A X||_F = {x.res:.1e}",
                "scale A by a power of two c = 2^k so its entries sit near 1 (exact), invert, and scale back: "
                "inv(c A) = inv(A) / c"))
        if not np.isfinite(x.eta) or not is_inverse(x.res, x.method):
            raise SingularMatrixError(_msg(
                "a", "must be numerically nonsingular to be inverted in " + self.dtype.name,
                f"||I - A X||_F = {x.res:.1e} >= 1 after {self.steps} Newton-Schulz step(s), so X carries no "
                f"correct digit of the inverse; condition number estimate ||A||_F ||X||_F = {cond_est:.1e} "
                f"(1/eps = {1 / eps:.1e})",
                "regularize: blocklin.solve(a, b, lam=...) (lam='gcv' chooses lam)"
                + ("" if precision not in ("mixed", "tf32") else f", or invert without precision='{precision}'")))
        if x.eta > self.tol and self.want.most > 0 and not self.want.exact:
            warn(f"inv: backward error {x.eta:.2e} ({x.method}) above tol {self.tol:.1e} after {self.steps} "
                 f"Newton-Schulz step(s) (condition estimate {cond_est:.1e}); the result is returned",
                 ConvergenceWarning)


__all__ = ["PROBED_SAFE_RESIDUAL", "Iterate", "NewtonSchulz", "Steps", "PROBES", "backward_error", "default_tol", "is_inverse", "ns_product",
           "ns_residual", "ns_update", "probe_estimate",
           "probe_products", "probes"]
