"""The versioned row generators of the sketch's test matrices (blocks/random.GaussianRows).

Any row range must be the same numbers whatever split it is drawn in (strips, tasks, budgets,
schedulers, and the appended rows of an updatable sketch); generators 1 and 3 must keep drawing exactly
the numbers stored sketches were made with (checked against their definitions, written out here);
generator 2's normals must be standard normal and generator 3's signs fair, both independent across rows,
blocks and streams (statistical tests at fixed seeds, each with thresholds of about five standard
errors); a run interrupted under another generator is not continued.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import scipy.stats

import blocklin as bl
from blocklin.errors import ParameterError
from blocklin.linalg.blocks import random as rnd
from blocklin.linalg.lowrank.checkpoint import low_rank_token
from blocklin.runtime.job import Job

GENERATORS = [rnd.GENERATOR_PHILOX64, rnd.GENERATOR_SFC64, rnd.GENERATOR_SIGNS]


def _splits(m: int, block: int) -> list[list[int]]:
    """Row boundaries: steps of 1 (the first rows), 7, 64, a block, a block and one, and random cuts."""
    cuts = np.sort(np.random.default_rng(3).choice(np.arange(1, m), size=25, replace=False))
    return [list(range(0, 150, 1)) + list(range(150, m, 301)) + [m], list(range(0, m, 7)) + [m],
            list(range(0, m, 64)) + [m], list(range(0, m, block)) + [m], list(range(0, m, block + 1)) + [m],
            [0, *cuts.tolist(), m]]


@pytest.mark.parametrize("generator", GENERATORS)
@pytest.mark.parametrize(("width", "cplx"), [(3, False), (20, False), (41, False), (6, True)])
def test_rows_of_any_split_equal_the_whole(generator, width, cplx):
    gen = rnd.GaussianRows(5, rnd.STREAM_UPSILON, width, complex=cplx, generator=generator)
    m = 3 * gen.block + 77
    whole = gen.rows(0, m)
    assert whole.shape == (m, width) and whole.dtype == (np.complex128 if cplx else np.float64)
    for bounds in _splits(m, gen.block):
        g = rnd.GaussianRows(5, rnd.STREAM_UPSILON, width, complex=cplx, generator=generator)
        pieces = [g.rows(r0, r1) for r0, r1 in zip(bounds[:-1], bounds[1:]) if r1 > r0]
        np.testing.assert_array_equal(np.vstack(pieces), whole)
    # ranges alone (a task, an appended block), backwards, and into float32 (complex64) or strided views
    g = rnd.GaussianRows(5, rnd.STREAM_UPSILON, width, complex=cplx, generator=generator)
    for r0, r1 in [(gen.block + 5, 2 * gen.block + 9), (10, 20), (m - 3, m), (0, 1)]:
        np.testing.assert_array_equal(g.rows(r0, r1), whole[r0:r1])
    out = np.zeros((40, width + 2), dtype=np.complex64 if cplx else np.float32)
    g.rows(gen.block - 20, gen.block + 20, out=out[:, 1:-1])
    np.testing.assert_array_equal(out[:, 1:-1], whole[gen.block - 20:gen.block + 20].astype(out.dtype))
    assert not out[:, 0].any() and not out[:, -1].any()


def _generator_1(seed: int, stream: int, width: int, m: int, cplx: bool = False) -> np.ndarray:
    """Generator 1 as it was defined: Philox keyed by SeedSequence([seed, stream, block, draws, 64]) for
    every block of 64 rows, each block drawn whole."""
    draws = (2 if cplx else 1) * width
    blocks = [np.random.Generator(np.random.Philox(np.random.SeedSequence([seed, stream, b, draws, 64])))
              .standard_normal((64, draws)) for b in range(-(-m // 64))]
    out = np.vstack(blocks)[:m]
    return out.view(np.complex128) if cplx else out


@pytest.mark.parametrize(("width", "cplx"), [(7, False), (20, False), (5, True)])
def test_generator_1_draws_the_numbers_it_always_did(width, cplx):
    ref = _generator_1(3, rnd.STREAM_PHI, width, 1000, cplx)
    g = rnd.GaussianRows(3, rnd.STREAM_PHI, width, complex=cplx, generator=1)
    assert g.block == rnd.SKETCH_RNG_BLOCK
    np.testing.assert_array_equal(g.rows(0, 1000), ref)
    op = rnd.sketch_test_matrices(3, 300, width, 11, generator=1)
    np.testing.assert_array_equal(op[:, :width], _generator_1(3, rnd.STREAM_SKETCH_OMEGA, width, 300))
    np.testing.assert_array_equal(op[:, width:], _generator_1(3, rnd.STREAM_SKETCH_PSI, 11, 300))


def test_generator_2_is_standard_normal_and_independent():
    """One stream over 30 blocks: the entries' distribution (Kolmogorov-Smirnov against N(0, 1), mean,
    variance, kurtosis), the correlation of consecutive rows across block boundaries and of two streams
    of one seed, and the column correlations: each within about five standard errors."""
    width = 20
    g = rnd.GaussianRows(11, rnd.STREAM_UPSILON, width)
    assert g.block == 4096
    x = g.rows(0, 30 * g.block)
    flat = x.ravel()
    n = flat.size  # 2.5 million
    assert scipy.stats.kstest(flat[:200_000], "norm").pvalue > 1e-4
    assert abs(flat.mean()) < 5 / np.sqrt(n)
    assert abs(flat.var() - 1) < 5 * np.sqrt(2 / n)
    assert abs(scipy.stats.kurtosis(flat)) < 5 * np.sqrt(24 / n)
    # rows on either side of every block boundary, and the first rows of consecutive blocks
    ends = np.arange(1, 30) * g.block
    for a, b in [(x[ends - 1], x[ends]), (x[ends - g.block], x[ends])]:
        r = np.corrcoef(a.ravel(), b.ravel())[0, 1]
        assert abs(r) < 5 / np.sqrt(a.size)
    other = rnd.GaussianRows(11, rnd.STREAM_PHI, width).rows(0, x.shape[0])
    assert abs(np.corrcoef(flat, other.ravel())[0, 1]) < 5 / np.sqrt(n)
    c = np.corrcoef(x, rowvar=False)
    assert np.abs(c - np.eye(width)).max() < 5 / np.sqrt(x.shape[0])


def _generator_3_signs(seed: int, stream: int, width: int, m: int, cplx: bool = False) -> np.ndarray:
    """Generator 3's rows of Upsilon and Phi as they are defined: SFC64 keyed by SeedSequence([seed, stream,
    block, draws, block rows, 3]) for every block of ``block_rows(draws)`` rows, each row the next
    ceil(draws / 64) words as little-endian bytes, least significant bit first, a set bit -1 (complex:
    consecutive pairs the real and imaginary signs)."""
    draws = (2 if cplx else 1) * width
    h, nw = rnd.block_rows(draws, 2), -(-draws // 64)
    rows = []
    for b in range(-(-m // h)):
        bits = np.random.SFC64(np.random.SeedSequence([seed, stream, b, draws, h, 3]))
        for _ in range(min(h, m - b * h)):
            row = int.from_bytes(bits.random_raw(nw).astype("<u8").tobytes(), "little")
            rows.append([1.0 - 2.0 * ((row >> i) & 1) for i in range(draws)])
    out = np.array(rows)
    return out[:, 0::2] + 1j * out[:, 1::2] if cplx else out


@pytest.mark.parametrize(("width", "cplx"), [(3, False), (20, False), (41, False), (100, False), (6, True)])
def test_generator_3_draws_signs_for_upsilon_and_phi(width, cplx):
    """Generator 3's row test matrices are random signs as defined (+-1, complex +-1 +-1j), the same
    whatever split draws them (strips, ranges alone, float32 views); its Omega and Psi, and every
    GaussianRows use, are generator 2's normals."""
    gen = rnd.row_test_rows(5, rnd.STREAM_UPSILON, width, complex=cplx, generator=3)
    assert isinstance(gen, rnd.SignRows) and gen.block == rnd.block_rows((2 if cplx else 1) * width, 2)
    m = 2 * gen.block + 77
    whole = gen.rows(0, m)
    assert whole.dtype == (np.complex128 if cplx else np.float64)
    np.testing.assert_array_equal(whole[:300], _generator_3_signs(5, rnd.STREAM_UPSILON, width, 300, cplx))
    np.testing.assert_array_equal(whole[gen.block:gen.block + 5],
                                  _generator_3_signs(5, rnd.STREAM_UPSILON, width, gen.block + 5, cplx)[gen.block:])
    for bounds in _splits(m, gen.block):
        g = rnd.row_test_rows(5, rnd.STREAM_UPSILON, width, complex=cplx, generator=3)
        pieces = [g.rows(r0, r1) for r0, r1 in zip(bounds[:-1], bounds[1:]) if r1 > r0]
        np.testing.assert_array_equal(np.vstack(pieces), whole)
    g = rnd.row_test_rows(5, rnd.STREAM_UPSILON, width, complex=cplx, generator=3)
    for r0, r1 in [(gen.block + 5, 2 * gen.block + 9), (10, 20), (m - 3, m), (0, 1)]:
        np.testing.assert_array_equal(g.rows(r0, r1), whole[r0:r1])
    out = np.zeros((40, width + 2), dtype=np.complex64 if cplx else np.float32)
    g.rows(gen.block - 20, gen.block + 20, out=out[:, 1:-1])
    np.testing.assert_array_equal(out[:, 1:-1], whole[gen.block - 20:gen.block + 20].astype(out.dtype))
    assert not out[:, 0].any() and not out[:, -1].any()
    np.testing.assert_array_equal(rnd.GaussianRows(5, rnd.STREAM_UPSILON, width, complex=cplx, generator=3).rows(0, 99),
                                  rnd.GaussianRows(5, rnd.STREAM_UPSILON, width, complex=cplx, generator=2).rows(0, 99))
    np.testing.assert_array_equal(rnd.sketch_test_matrices(5, 70, width, 11, generator=3),
                                  rnd.sketch_test_matrices(5, 70, width, 11, generator=2))
    assert rnd.row_test_bytes(width, cplx, 3) == rnd.sign_block_bytes(width, cplx) <= max(16 << 10, 64 * width * 24)


def test_generator_3_signs_are_fair_and_independent():
    """One stream over 30 blocks: the signs' mean, the correlation of consecutive rows across block
    boundaries and of two streams of one seed, and the column correlations, each within about five
    standard errors; the blocks of a stream, and other seeds and widths, differ."""
    width = 20
    g = rnd.row_test_rows(11, rnd.STREAM_UPSILON, width, generator=3)
    x = g.rows(0, 30 * g.block)
    assert set(np.unique(x).tolist()) == {-1.0, 1.0}
    flat = x.ravel()
    assert abs(flat.mean()) < 5 / np.sqrt(flat.size)
    ends = np.arange(1, 30) * g.block
    for a, b in [(x[ends - 1], x[ends]), (x[ends - g.block], x[ends])]:
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 5 / np.sqrt(a.size)
    other = rnd.row_test_rows(11, rnd.STREAM_PHI, width, generator=3).rows(0, x.shape[0])
    assert abs(np.corrcoef(flat, other.ravel())[0, 1]) < 5 / np.sqrt(flat.size)
    c = np.corrcoef(x, rowvar=False)
    assert np.abs(c - np.eye(width)).max() < 5 / np.sqrt(x.shape[0])
    assert not np.array_equal(x[:10], x[g.block:g.block + 10])
    assert not np.array_equal(rnd.row_test_rows(12, rnd.STREAM_UPSILON, width, generator=3).rows(0, 500), x[:500])
    assert not np.array_equal(rnd.row_test_rows(11, rnd.STREAM_UPSILON, width + 1, generator=3).rows(0, 500)[:, :width],
                              x[:500])


def test_keys_give_other_numbers():
    base = rnd.GaussianRows(3, rnd.STREAM_UPSILON, 7).rows(0, 500)
    for other in (rnd.GaussianRows(3, rnd.STREAM_PHI, 7), rnd.GaussianRows(4, rnd.STREAM_UPSILON, 7),
                  rnd.GaussianRows(3, rnd.STREAM_UPSILON, 7, generator=1)):
        assert not np.array_equal(other.rows(0, 500), base)
    assert not np.array_equal(rnd.GaussianRows(3, rnd.STREAM_UPSILON, 8).rows(0, 500)[:, :7], base)
    # the blocks of one stream are not copies of each other
    g = rnd.GaussianRows(3, rnd.STREAM_UPSILON, 7)
    assert not np.array_equal(g.rows(0, 10), g.rows(g.block, g.block + 10))


def test_block_sizes_and_memory():
    assert rnd.block_rows(20) == 4096 and rnd.block_rows(41) == 4096 and rnd.block_rows(100) == 2048
    assert rnd.block_rows(10_000) == 64 and rnd.block_rows(20, generator=1) == 64
    for width, cplx in [(1, False), (20, False), (41, True), (300, False), (5000, False)]:
        held = rnd.block_bytes(width, cplx)
        assert held == rnd.GaussianRows(0, 1, width, complex=cplx).buf.nbytes
        assert held <= max(16 << 10, 64 * width * (16 if cplx else 8))


@pytest.mark.parametrize("bad", [0, 4, "2", "x", True, 1.5, 2.0])
def test_unknown_generator_is_refused(bad):
    with pytest.raises(ParameterError, match=r"generator: must be one of the test-matrix generators \[1, 2, 3\].*"
                                             r"pass generator=3"):
        rnd.GaussianRows(0, 1, 4, generator=bad)


def test_results_and_tokens_record_the_generator(tmp_path, monkeypatch):
    a = np.random.default_rng(0).standard_normal((300, 12))
    res = bl.svd(a, 3, method="sketch", seed=1)
    assert res.report["sketch_generator"] == rnd.SKETCH_GENERATOR == 3
    path = bl.from_array(a, tmp_path / "a.zarr").path
    with Job("svd") as job:
        A = job.operand(path, "a")
        token = low_rank_token(job, A, op="svd", k=3, method="sketch", seed=1)
        monkeypatch.setattr(rnd, "SKETCH_GENERATOR", 1)
        assert low_rank_token(job, A, op="svd", k=3, method="sketch", seed=1) != token
    old = bl.svd(a, 3, method="sketch", seed=1)
    assert old.report["sketch_generator"] == 1
    assert not np.array_equal(old.s, res.s)  # other test matrices: other (equally accurate) estimates


CHILD = textwrap.dedent(r"""
    import os, signal, sys
    import blocklin as bl
    from blocklin.linalg.blocks import random as rnd
    from blocklin.runtime import checkpoints

    rnd.SKETCH_GENERATOR = int(sys.argv[3])
    save = checkpoints.Checkpoints.save

    def killing_save(self, name, **arrays):
        save(self, name, **arrays)
        os.kill(os.getpid(), signal.SIGKILL)  # the run's seed is on disk: its partial output is resumable

    checkpoints.Checkpoints.save = killing_save
    bl.svd(sys.argv[1], 4, method="sketch", seed=2, memory="256KiB", out=sys.argv[2])
    print("FINISHED")
""")


@pytest.mark.parametrize("interrupted_by", [1, 2, 3])
def test_a_run_interrupted_under_another_generator_is_not_resumed(tmp_path, interrupted_by):
    """A sketch killed while made by generator 1 or 2 leaves its partial output; resume=True under the
    current generator (3) starts fresh (with the resume's warning) and gives the bits of an uninterrupted
    run. The same kill under generator 3 is resumed (what the first cases would do were the generator not
    in the token)."""
    a = np.random.default_rng(1).standard_normal((2000, 30))
    path = str(bl.from_array(a, tmp_path / "a.zarr", chunks=(256, 30)).path)
    out = str(tmp_path / "out.zarr")
    proc = subprocess.run([sys.executable, "-c", CHILD, path, out, str(interrupted_by)], capture_output=True,
                          text=True, timeout=120)
    assert "FINISHED" not in proc.stdout and proc.returncode == -9, proc.stderr[-2000:]
    assert [p for p in os.listdir(tmp_path) if p.startswith(".out.zarr.partial-")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = bl.svd(path, 4, method="sketch", seed=2, memory="256KiB", out=out, resume=True)
    fresh = [str(w.message) for w in caught if "no unfinished run" in str(w.message)]
    assert res.report["resumed"] is (interrupted_by == rnd.SKETCH_GENERATOR)
    assert bool(fresh) is (interrupted_by != rnd.SKETCH_GENERATOR)
    ref = bl.svd(path, 4, method="sketch", seed=2, memory="256KiB", out=str(tmp_path / "ref.zarr"))
    assert np.array_equal(res.s, ref.s) and np.array_equal(res.U.to_numpy(), ref.U.to_numpy())
    stored = json.load(open(os.path.join(out, "zarr.json")))["attributes"]["blocklin"]
    assert stored["report"]["method"] == "sketch" and stored["report"]["sketch_generator"] == 3
