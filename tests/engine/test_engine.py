"""The engine's shared pieces: settings, validation, plan entries, scratch stores, pass counting."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import BlocklinError, DTypeError, ParameterError
from blocklin.linalg.blocks.tall_kernels import apply_kernel
from blocklin.runtime.job import Job
from blocklin.runtime.passes import collect_rows, run_pass, source
from support.tolerances import assert_factorization, assert_gram


def test_plan_entries_return_what_explain_returns(rng):
    a = rng.standard_normal((96, 64))
    b = rng.standard_normal((64, 80))
    assert bl.matmul_plan(a, b, memory="256KiB") == bl.matmul(a, b, memory="256KiB", explain=True)
    sq = rng.standard_normal((64, 64))
    assert bl.inv_plan(sq, precision="mixed", memory="1MiB") == bl.inv(sq, precision="mixed", memory="1MiB",
                                                                        explain=True)
    rhs = rng.standard_normal((96, 2))
    plan = bl.solve_plan(a, rhs, lam="gcv", memory="1MiB")
    assert plan == bl.solve(a, rhs, lam="gcv", memory="1MiB", explain=True)
    assert plan.orientation == "tall" and plan.passes == 1  # one streaming-QR pass for a lambda rule


def test_every_operation_takes_the_same_settings_and_refuses_unknown_ones(rng):
    a = rng.standard_normal((60, 8))
    with pytest.raises(ParameterError, match=r"memroy: is not a setting.*Fix: check the spelling"):
        bl.svd(a, 2, memroy="1MiB")
    # keywords of the functions blocklin stands in for had been refused as misspelt ("check the spelling")
    with pytest.raises(ParameterError, match=r"^sigma: is SciPy's shift-invert.*Fix: pass which='LA'"):
        bl.eigsh(a.T @ a, 2, sigma=0.5)
    with pytest.raises(ParameterError, match=r"^random_state: is scikit-learn's seed.*Fix: pass seed="):
        bl.pca(a, 2, random_state=0)
    with pytest.raises(ParameterError, match=r"^alpha: is scikit-learn's ridge penalty.*lam=sqrt\(alpha\)"):
        bl.solve(a, a[:, 0], alpha=1.0)
    # settings that used to be missing from some operations (workers, device_memory) are accepted
    q, r = bl.linalg.blocks.orth.orthonormalize(a, workers=1, device="cpu", memory="4MiB")
    assert_factorization(a, np.asarray(q) @ r)
    sr = bl.linalg.blocks.streaming_qr.streaming_r(a, device="cpu", device_memory="1GiB", memory="4MiB")
    assert_gram(sr.r.T @ sr.r, a.T @ a, a, const=2 * (a.shape[1] + 1))  # QR's gamma_{mn}: see test_solve


@pytest.mark.parametrize("call", [
    lambda a: bl.solve(a, np.ones((a.shape[0], 1), np.float16)),
    lambda a: bl.svd(a, 2),
    lambda a: bl.eigsh(a[:8, :8], 2),
    lambda a: bl.inv(a[:8, :8]),
    lambda a: bl.aslinearoperator(a),
])
def test_float16_is_refused_everywhere(call):
    a = np.ones((16, 8), dtype=np.float16)
    with pytest.raises(DTypeError, match="float32 or float64.*float16"):
        call(a)


def test_bad_arguments_are_parameter_errors():
    a = np.random.default_rng(0).standard_normal((40, 10))
    for call, name in [(lambda: bl.svd(a, 3, method="qr"), "method"), (lambda: bl.svd(a, 3, seed=-1), "seed"),
                       (lambda: bl.svd(a, 2.5), "k"), (lambda: bl.solve(a, a[:, :1], refine=-1), "refine"),
                       (lambda: bl.eigsh(a[:10], 2, which="XX"), "which"), (lambda: bl.matmul(object(), a), "a")]:
        with pytest.raises(ParameterError, match=f"^{name}: .*Fix: ") as info:
            call()
        assert isinstance(info.value, (BlocklinError, ValueError))


def test_scratch_stores_are_named_in_creation_order():
    names = []
    for _ in range(2):
        with Job("scratch-test", memory="1MiB") as job:
            paths = [job.scratch(n, (4, 4), "float64", (2, 2)) for n in ("w", "r", "w")]
            names.append([str(p).rsplit("/", 1)[1] for p in paths])
    assert names[0] == names[1] == ["w-1.zarr", "r-2.zarr", "w-3.zarr"]


def test_run_pass_plans_from_the_kernel_declaration_and_the_job_counts_it(rng):
    a = rng.standard_normal((500, 6))
    w = rng.standard_normal((6, 3))
    with Job("pass-test", memory="64KiB", scheduler="sync") as job:
        A = job.operand(a, "a")
        states, plan = run_pass(job, apply_kernel, [source(A)], {"W": w, "collect": True}, description="A W")
        run_pass(job, apply_kernel, [source(A)], {"W": w, "collect": True}, over="intermediate")
        assert (job.passes(), job.passes("a"), job.passes("intermediate")) == (2, 1, 1)
    np.testing.assert_allclose(collect_rows(states, 500, 3), a @ w, atol=1e-12)
    assert len(plan.groups) >= 1 and plan.strip < 500  # the budget forces several strips
    assert plan.peak_memory <= 64 * 1024
