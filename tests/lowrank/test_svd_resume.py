"""``resume=True`` after SIGKILL or Ctrl-C: svd, eigsh and pca skip the passes they completed and give
the same bits as an uninterrupted run.

A subprocess runs the operation and interrupts itself (SIGKILL, or SIGINT as Ctrl-C sends it) right
after its N-th pass checkpoint is on disk; the test then resumes in this process and compares with a
run that was never interrupted. Small matrices streamed at KiB budgets, so every operation makes
several passes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import blocklin as bl

CHILD = textwrap.dedent(r"""
    import json, os, signal, sys, warnings
    warnings.simplefilter("ignore")
    import blocklin as bl
    from blocklin.runtime import checkpoints as checkpoint

    after, sig, op, kwargs = int(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    save, seen = checkpoint.Checkpoints.save, [0]

    def interrupting_save(self, name, **arrays):
        save(self, name, **arrays)
        if name != "seed":
            seen[0] += 1
            if seen[0] == after:
                os.kill(os.getpid(), signal.SIGKILL if sig == "KILL" else signal.SIGINT)

    checkpoint.Checkpoints.save = interrupting_save
    getattr(bl, op)(**kwargs)
    print("FINISHED")
""")


def _interrupt(after: int, sig: str, op: str, kwargs: dict) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(after), sig, op, json.dumps(kwargs)],
                          capture_output=True, text=True, timeout=120)
    assert "FINISHED" not in proc.stdout, "the run ended before it was interrupted"
    if sig == "KILL":
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr


def _bits(result) -> list:
    if hasattr(result, "components_"):
        return [result.components_, result.explained_variance_, result.mean_]
    return [x.to_numpy() if isinstance(x, bl.Matrix) else np.asarray(x) for x in result]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume")
    rng = np.random.default_rng(4)
    a = rng.standard_normal((900, 50)) * np.logspace(0, -2, 50) + 2.0
    s = rng.standard_normal((120, 120))
    return {"a": str(bl.from_array(a, folder / "a.zarr", chunks=(100, 50)).path),
            "s": str(bl.from_array(s + s.T, folder / "s.zarr", chunks=(40, 40)).path)}


CASES = {
    "svd-rsvd": ("svd", lambda d: {"a": d["a"], "k": 4, "power_iters": 4, "seed": 2, "memory": "384KiB"}),
    "svd-lanczos-centered": ("svd", lambda d: {"a": d["a"], "k": 4, "center": True, "seed": 3, "memory": "512KiB",
                                               "method": "lanczos"}),
    # the default for this narrow matrix: the means pass makes the Gram, then one Rayleigh-Ritz pass
    "svd-gram-centered": ("svd", lambda d: {"a": d["a"], "k": 4, "center": True, "seed": 3, "memory": "512KiB"}),
    "eigsh": ("eigsh", lambda d: {"a": d["s"], "k": 3, "seed": 1, "memory": "384KiB", "order": "descending"}),
    "pca": ("pca", lambda d: {"a": d["a"], "k": 3, "seed": 5, "memory": "512KiB"}),
}


@pytest.mark.parametrize(("case", "sig"), [(case, "KILL") for case in CASES] + [("svd-lanczos-centered", "INT"),
                                                                                  ("eigsh", "INT")])
def test_resume_gives_identical_bits(tmp_path, data, case, sig):
    op, make = CASES[case]
    kwargs = make(data)
    ref = getattr(bl, op)(**kwargs, out=str(tmp_path / "ref.zarr"))
    out = str(tmp_path / "out.zarr")
    # Ctrl-C on a run that may be resumed keeps its partial output (SIGKILL leaves it anyway)
    _interrupt(2, sig, op, {**kwargs, "out": out, "resume": sig == "INT"})
    assert not os.path.exists(out)
    partials = [p for p in os.listdir(tmp_path) if p.startswith(".out.zarr.partial-")]
    assert len(partials) == 1
    res = getattr(bl, op)(**kwargs, out=out, resume=True)
    report = res.report
    assert report["restored_checkpoints"], "nothing was restored"
    assert report["passes"] < ref.report["passes"]  # the completed passes were skipped
    for got, want in zip(_bits(res), _bits(ref)):
        assert np.array_equal(got, want)  # bit for bit
    assert os.path.exists(out) and not [p for p in os.listdir(tmp_path) if ".partial-" in p]
    assert not os.path.exists(os.path.join(out, "work"))  # the checkpoints are no part of the output


def test_ctrl_c_without_resume_keeps_the_checkpoints_for_resume(tmp_path, data):
    """Ctrl-C keeps an svd's partial output (its pass checkpoints) without resume too; resume continues it."""
    kwargs = CASES["svd-rsvd"][1](data)
    ref = bl.svd(**kwargs, out=str(tmp_path / "ref.zarr"))
    out = str(tmp_path / "out.zarr")
    _interrupt(2, "INT", "svd", {**kwargs, "out": out})
    assert len([p for p in os.listdir(tmp_path) if ".partial-" in p]) == 1  # kept for --resume
    res = bl.svd(**kwargs, out=out, resume=True)
    assert res.report["restored_checkpoints"] and res.report["passes"] < ref.report["passes"]
    assert np.array_equal(res.s, ref.s) and np.array_equal(res.U.to_numpy(), ref.U.to_numpy())
    assert not [p for p in os.listdir(tmp_path) if ".partial-" in p]


def test_resume_needs_out(data):
    with pytest.raises(bl.errors.ParameterError, match="resume: needs out="):
        bl.svd(data["a"], 3, resume=True)


def test_cli_resume(tmp_path, data, capsys):
    from blocklin.cli.main import main

    args = ["svd", data["a"], "-k", "4", "--power-iters", "4", "--seed", "2", "--memory", "384KiB", "--json"]
    assert main([*args, "-o", str(tmp_path / "ref.zarr")]) == 0
    ref = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    kwargs = CASES["svd-rsvd"][1](data)
    _interrupt(3, "KILL", "svd", {**kwargs, "out": str(tmp_path / "out.zarr")})
    assert main([*args, "-o", str(tmp_path / "out.zarr"), "--resume"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["s"] == ref["s"] and got["passes"] < ref["passes"]
