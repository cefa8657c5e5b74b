"""scikit-learn's ``PCA`` options on blocklin's PCA: ``n_components`` as None, a variance fraction or
``"mle"``, ``whiten``, ``noise_variance_``, ``get_covariance``, ``get_precision``, ``score_samples``,
``score`` and ``inverse_transform``, in memory and streamed, against ``PCA(svd_solver="full")`` fitted
on the same data (ported from scikit-learn's ``sklearn/decomposition/tests/test_pca.py``; each test
names the case it ports).

Bounds (:mod:`support.tolerances`): the centered products are rounded at ``||A||_2`` with the means,
``b = c m eps ||A||_2`` on each singular value, so the explained variances within
``(2 s + b) b / (m - 1)`` (:func:`assert_explained_variance`). The model's covariance is a sum of
``k`` rank-one terms with those variances: its error is bounded by ``c m eps ||A||_2^2 / (m - 1)`` per
variance and by the components' error ``eps ||A||^2 / gap`` (Davis-Kahan) times the variance they
carry, so the data below keep the variances of the kept components apart (gaps of at least a tenth of
``s_1^2``) and the comparison is norm-wise over the matrix.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
from sklearn.decomposition import PCA

import blocklin as bl
from blocklin.errors import BlocklinWarning, ParameterError, SingularMatrixError
from support.tolerances import assert_close_to, assert_explained_variance, eps

BUDGETS = {"streamed": "1MiB", "in-memory": "256MiB"}


def low_rank_plus_noise(m: int = 3000, n: int = 20, rank: int = 5, seed: int = 0) -> np.ndarray:
    """Rank-``rank`` signal with variances 5^2 ... 1^2 (gaps >= 1/10 of the first) plus unit noise and offsets."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((m, rank)) * np.linspace(25.0, 9.0, rank) ** 0.5
    v, _ = np.linalg.qr(rng.standard_normal((n, rank)))
    return u @ v.T * 3 + 0.3 * rng.standard_normal((m, n)) + rng.standard_normal(n) * 7


def model_bound(a: np.ndarray, *, const: float = 8.0) -> float:
    """Norm-wise bound on the model's covariance (module docstring): ``c m eps ||A||_2^2 / (m - 1)`` times
    the condition of the components, ``s_1^2 / gap`` with the gap at a tenth of ``s_1^2``."""
    m = a.shape[0]
    return const * m * eps(a.dtype) * np.linalg.norm(a, 2) ** 2 / (m - 1) * 10.0


@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("n_components", [None, 0.9, "mle", 3], ids=["none", "fraction", "mle", "int"])
def test_n_components_as_scikit_learn_chooses(n_components, budget):
    """``test_pca_validation``/``test_n_components_none``, ``test_pca_dim`` (the fraction) and
    ``test_n_components_mle``/``test_infer_dim_*`` (Minka's choice)."""
    a = low_rank_plus_noise()
    ours = bl.pca(a, n_components, memory=BUDGETS[budget])
    ref = PCA(n_components, svd_solver="full").fit(a)
    assert ours.n_components_ == ref.n_components_
    assert ours.report["method"] == ("full" if not isinstance(n_components, int) else ours.report["method"])
    assert_explained_variance(ours.explained_variance_, ref.explained_variance_, ours.explained_variance_ratio_,
                              ref.explained_variance_ratio_, a)
    # the noise variance is a mean of variances left out: each carries the explained variances' bound
    bound = model_bound(a)
    assert_close_to(ours.noise_variance_, ref.noise_variance_, bound=bound, what="noise_variance_")
    assert_close_to(ours.get_covariance(), ref.get_covariance(), bound=bound * ours.n_components_,
                    what="get_covariance()")


def test_mle_picks_the_signal_rank():
    """``test_infer_dim_3``: a signal of rank 5 in unit noise gives ``"mle"`` the rank 5."""
    a = low_rank_plus_noise(rank=5, seed=3)
    assert bl.pca(a, "mle").n_components_ == 5 == PCA("mle", svd_solver="full").fit(a).n_components_


@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("case", ["one feature", "variances below 1e-15", "below float64's range squared"])
def test_mle_with_no_rank_to_test_keeps_none_as_scikit_learn(case, budget):
    """scikit-learn's ``_infer_dimension`` is the ``argmax`` of log-likelihoods that are all ``-inf`` for
    one feature (no rank ``1 <= k < n`` to test) and for variances all below its ``1e-15``: 0 components,
    ``noise_variance_`` the whole variance (blocklin had kept 1; of data near ``1e-200``, which blocklin
    scales into range, the rule had been applied to the scaled variances: 3 kept). Bounds as for the test
    above (the variances of data at ``1e-200`` are 0 in float64 on both sides)."""
    rng = np.random.default_rng(11)
    scale = {"one feature": 1.0, "variances below 1e-15": 1e-9, "below float64's range squared": 1e-200}[case]
    a = rng.standard_normal((400, 1)) if case == "one feature" else low_rank_plus_noise(400, 6, 3) * scale
    ours = bl.pca(a, "mle", memory=BUDGETS[budget])
    ref = PCA("mle", svd_solver="full").fit(a)
    assert ours.n_components_ == ref.n_components_ == 0 and ours.components_.shape == ref.components_.shape
    assert_close_to(ours.noise_variance_, ref.noise_variance_, bound=model_bound(a), what="noise_variance_")
    assert ours.transform(a[:5]).shape == (5, 0)
    assert_close_to(ours.get_covariance(), ref.get_covariance(), bound=model_bound(a) * a.shape[1],
                    what="get_covariance()")


@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("whiten", [False, True])
def test_whiten_transform_and_inverse(whiten, budget):
    """``test_whitening`` (unit-variance projections) and ``test_pca_inverse`` (the round trip through the
    kept components reconstructs the data to its left-out variance; all components: exactly)."""
    a = low_rank_plus_noise(seed=5)
    ours = bl.pca(a, 5, whiten=whiten, memory=BUDGETS[budget])
    ref = PCA(5, whiten=whiten, svd_solver="full").fit(a)
    y = ours.transform(a)
    if whiten:  # unit variance along each component
        assert_close_to(y.var(axis=0, ddof=1), np.ones(5), bound=100 * a.shape[0] * eps(a.dtype), what="var")
    # projections: the components' bound times the data's size
    scale = np.linalg.norm(a - a.mean(axis=0), axis=1).max() / (np.sqrt(ref.explained_variance_[-1]) if whiten else 1)
    assert_close_to(np.abs(y), np.abs(ref.transform(a)), bound=model_bound(a) * scale * a.shape[0] ** 0.5, what="y")
    back = ours.inverse_transform(y)
    assert_close_to(back, ref.inverse_transform(ref.transform(a)),
                    bound=model_bound(a) * np.linalg.norm(a) / np.sqrt(ref.explained_variance_[-1]), what="x back")
    every = bl.pca(a, None, whiten=whiten, memory=BUDGETS[budget])
    assert_close_to(every.inverse_transform(every.transform(a)), a,
                    bound=100 * a.shape[0] * eps(a.dtype) * np.linalg.norm(a) * (10 if whiten else 1), what="round trip")


def test_score_and_precision_as_probabilistic_pca():
    """``test_pca_score`` and ``test_pca_score3`` (the log-likelihood under probabilistic PCA), and
    ``test_pca_precision``: ``get_precision()`` is the inverse of ``get_covariance()``."""
    a = low_rank_plus_noise(seed=7)
    for n_components in (2, 5, "mle"):
        ours = bl.pca(a, n_components, memory="1MiB")
        ref = PCA(n_components, svd_solver="full").fit(a)
        prec = ours.get_precision()
        cov = ours.get_covariance()
        # inverse to the condition of the model's covariance (its largest over its smallest eigenvalue)
        kappa = np.linalg.cond(cov)
        assert_close_to(prec @ cov, np.eye(a.shape[1]), bound=100 * a.shape[1] * eps(a.dtype) * kappa, what="P C")
        # the mean log-likelihood: its gradient in the covariance is bounded by (|x|^2 ||P||^2 + ||P||) / 2
        grad = 0.5 * (np.mean(np.sum((a - a.mean(0)) ** 2, axis=1)) * np.linalg.norm(prec, 2) ** 2
                      + a.shape[1] * np.linalg.norm(prec, 2))
        assert_close_to(ours.score(a), ref.score(a), bound=grad * model_bound(a) * ours.n_components_,
                        what="score")
        assert ours.score_samples(a[:7]).shape == (7,)


def test_float32_keeps_float32():
    """``test_pca_dtype_preservation``: float32 data gives float32 attributes and projections."""
    a = low_rank_plus_noise(seed=9).astype(np.float32)
    ours = bl.pca(a, 0.8)
    assert ours.components_.dtype == ours.explained_variance_.dtype == np.float32
    assert ours.transform(a[:5]).dtype == ours.inverse_transform(ours.transform(a[:5])).dtype == np.float32


@pytest.mark.parametrize("n_components, words", [
    (-1, ["n_components", "'mle'", "-1"]),
    (1.0, ["n_components", "(0, 1)", "1.0"]),
    (-0.5, ["n_components", "-0.5"]),
    ("auto", ["n_components", "'auto'"]),
    (21, ["n_components", "min(n_samples, n_features) = 20", "21"]),
])
def test_bad_n_components_refused(n_components, words):
    """``test_pca_validation``: each bad value named, with the rule."""
    a = low_rank_plus_noise(m=200)
    with pytest.raises(ParameterError) as e:
        bl.pca(a, n_components)
    for w in words:
        assert w in str(e.value)


def test_mle_needs_more_samples_than_features():
    """``test_n_components_mle_error``: Minka's evidence is for ``n_samples >= n_features``."""
    a = low_rank_plus_noise(m=15)
    with pytest.raises(ParameterError, match="'mle' needs at least as many samples as features"):
        bl.pca(a, "mle")


@pytest.mark.parametrize("call, words", [
    (lambda a: bl.pca(a, None, method="lanczos"), ["n_components=None (all 6 = min(m, n)", "integer n_components <"]),
    (lambda a: bl.pca(a, 0.9, method="lanczos"), ["n_components=0.9 (all 6", "integer n_components <"]),
    (lambda a: bl.pca(a, 6, method="sketch"), ["n_components=6 (all 6", "integer n_components <"]),
    (lambda a: bl.svd(a, method="lanczos"), ["k=None (all 6", "integer k <"]),
], ids=["pca-none", "pca-fraction", "pca-all", "svd-none"])
def test_every_component_by_an_iterative_method_names_the_count_passed(call, words):
    """Every component comes from the whole space (``method="full"``, or ``"gram"``'s full eigh: see
    ``test_pca_gram_every_component.py``): the refusal of an iterative method names the count as it was
    passed (it had named ``k=6``, which ``pca`` takes no ``k`` for)."""
    a = low_rank_plus_noise(m=40, n=6)
    with pytest.raises(ParameterError) as e:
        call(a)
    assert "k=6" not in str(e.value)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("n_components, source", [
    (None, "in-memory"), (None, "streamed"), (2, "in-memory"), (2, "streamed"), (2, "sparse"),
    (0.5, "in-memory"), (0.5, "streamed")])  # a stored sparse matrix takes an integer count alone
def test_data_of_no_variance_has_nan_ratios_as_scikit_learn(n_components, source, tmp_path):
    """Constant data (every column constant, all zero for the sparse store): the ratios are 0 / 0,
    ``nan`` as scikit-learn's (they had been 0, a share of a variance there is not), with a warning that
    says why; a fraction keeps scikit-learn's count (one component: it had kept every one)."""
    x = np.zeros((40, 5)) if source == "sparse" else np.tile(np.arange(1.0, 6.0), (40, 1))
    a = bl.from_sparse(scipy.sparse.csr_matrix(x), tmp_path / "s.zarr") if source == "sparse" else x
    with pytest.warns(RuntimeWarning, match="invalid value"):
        ref = PCA(n_components, svd_solver="full").fit(x)
    with pytest.warns(BlocklinWarning, match=r"explained_variance_ratio_ is nan \(0 / 0\).*no variance"):
        p = bl.pca(a, n_components, **({"memory": "1MiB"} if source == "streamed" else {}))
    assert p.n_components_ == ref.n_components_
    np.testing.assert_array_equal(p.explained_variance_ratio_, ref.explained_variance_ratio_)  # nan == nan here
    assert np.isnan(p.explained_variance_ratio_).all()
    np.testing.assert_array_equal(p.explained_variance_, ref.explained_variance_)
    assert p.noise_variance_ == ref.noise_variance_ == 0.0 and p.total_variance_ == 0.0
    np.testing.assert_array_equal(p.mean_, ref.mean_)


def test_cli_variance_fraction_and_mle(tmp_path, capsys):
    import json

    from blocklin.cli.main import main

    def cli(*argv):
        assert main([*argv, "--json"]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    a = low_rank_plus_noise(seed=11)
    bl.from_array(a, str(tmp_path / "a.zarr"))
    ref = PCA(0.9, svd_solver="full").fit(a)
    summary = cli("pca", str(tmp_path / "a.zarr"), "--variance", "0.9")
    assert summary["k"] == ref.n_components_ == len(summary["relative_residuals"])
    assert summary["noise_variance"] > 0
    summary = cli("pca", str(tmp_path / "a.zarr"), "-k", "mle")
    assert summary["k"] == PCA("mle", svd_solver="full").fit(a).n_components_
    with pytest.raises(SystemExit):  # -k and --variance are one choice
        main(["pca", str(tmp_path / "a.zarr"), "-k", "2", "--variance", "0.5"])
    with pytest.raises(SystemExit):
        main(["pca", str(tmp_path / "a.zarr"), "--variance", "1.5"])
    assert "--variance: must be a fraction of the variance in (0, 1); got '1.5'" in capsys.readouterr().err
    summary = cli("svd", str(tmp_path / "a.zarr"), "-k", "3", "--which", "SM", "-o", str(tmp_path / "sm.zarr"))
    ref_s = np.linalg.svd(a, compute_uv=False)
    assert summary["method"] == "full" and len(summary["s"]) == 3
    np.testing.assert_array_less(np.abs(np.array(summary["s"]) - ref_s[-3:]),
                                 8 * a.shape[0] * eps(a.dtype) * ref_s[0])


@pytest.mark.parametrize("wide", [False, True], ids=["tall", "wide"])
@pytest.mark.parametrize("method", ["auto", "rsvd", "sketch", "lanczos"])
@pytest.mark.parametrize("budget", list(BUDGETS))
def test_stored_factors_carry_scikit_learns_signs(tmp_path, method, budget, wide):
    """``pca(out=...)`` stores ``Vt`` with the signs of ``components_`` (scikit-learn's rule: the largest
    entry of each component positive) and ``U`` to match (``U diag(s) Vt`` is the centered data); before,
    the stored factors kept the SVD's own signs (10 of 20 components matched on the issue's matrix)."""
    a = low_rank_plus_noise(m=3000 if not wide else 60, n=20 if not wide else 3000, rank=5, seed=13)
    k = 4
    if wide and method == "auto":
        pytest.skip("a wide centered matrix takes block Lanczos under auto: the lanczos case")
    p = bl.pca(a, k, method=method, memory=BUDGETS[budget], seed=0, out=tmp_path / "p.zarr")
    vt = bl.open(tmp_path / "p.zarr" / "Vt").to_numpy()
    assert np.array_equal(vt, p.components_)
    big = np.argmax(np.abs(vt), axis=1)
    assert np.all(vt[np.arange(k), big] > 0)
    u = bl.open(tmp_path / "p.zarr" / "U").to_numpy()
    ac = a - a.mean(axis=0)
    # U flipped with Vt: u_i^T A_c v_i is about +s_i for each triplet (-s_i had only one been flipped;
    # the single-pass sketch's triplets are approximate, so the test is the sign)
    assert np.all(np.einsum("mi,mn,in->i", u, ac, vt) > 0)
    if method != "sketch":  # converged components: the same entries are the largest, with the same signs
        ref = PCA(k, svd_solver="full").fit(a)
        assert np.all(np.sign(p.components_[np.arange(k), big]) == np.sign(ref.components_[np.arange(k), big]))


def test_precision_of_a_singular_model_is_refused_by_name():
    """``n_components=None`` of data with a constant column: every component kept, one of variance 0, no
    noise, a singular covariance. scikit-learn's ``score`` fails in its inversion (``LinAlgError``); so does
    blocklin's, as a ``SingularMatrixError`` (a ``LinAlgError``) that names ``noise_variance_`` and the fix
    (it had been NumPy's bare "Singular matrix")."""
    rng = np.random.default_rng(12)
    a = np.column_stack([rng.standard_normal(50), np.full(50, 2.0), rng.standard_normal(50)])
    ref = PCA(None, svd_solver="full").fit(a)
    with pytest.raises(np.linalg.LinAlgError):
        ref.score(a)
    ours = bl.pca(a, None)
    assert ours.noise_variance_ == ref.noise_variance_ == 0.0
    with pytest.raises(SingularMatrixError, match="noise_variance_: must be positive .* Fix: fit fewer components"):
        ours.score(a)


@pytest.mark.parametrize("e", [300, -300])
def test_precision_and_score_of_data_beyond_two_to_the_256(e):
    """The model of ``2^e X`` is that of ``X`` with variances ``4^e`` times: its precision is ``4^-e``
    times and its score ``n e log 2`` less. The variances (about ``2^600`` here) are in float64's
    range, their squares are not: the inversion lemma had divided by ``noise ** 2`` (an
    ``OverflowError`` for ``e = 300``, a precision of ``inf`` and ``nan`` and a score of ``nan``,
    no warning, for ``e = -300``). Scaling by a power of two is exact, so both runs round alike but
    for the order BLAS sums in: bounds of a few ``n eps`` relative to the unscaled model."""
    a = low_rank_plus_noise(m=200, n=6, rank=2, seed=3)
    ref = bl.pca(a, 2, seed=0)
    got = bl.pca(np.ldexp(a, e), 2, seed=0)
    prec = ref.get_precision()
    kappa = np.linalg.cond(ref.get_covariance())
    assert_close_to(np.ldexp(got.get_precision(), 2 * e), prec,
                    bound=100 * a.shape[1] * eps(a.dtype) * kappa * np.linalg.norm(prec), what="precision")
    score = ref.score(a)
    assert_close_to(got.score(np.ldexp(a, e)) + a.shape[1] * e * np.log(2.0), score,
                    bound=100 * a.shape[1] * eps(a.dtype) * kappa * (abs(score) + a.shape[1]), what="score")
