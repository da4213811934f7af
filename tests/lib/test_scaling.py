"""course_lib.scaling against the papers' numbers, brute-force minima and laws with known constants."""

import math

import pytest

from course_lib import model, scaling

CHINCHILLA = scaling.ChinchillaLaw()


def test_gopher_and_chinchilla_losses_as_in_the_first_deck():
    law = CHINCHILLA
    assert law.A / 280e9**law.alpha == pytest.approx(0.052, abs=5e-4)
    assert law.B / 300e9**law.beta == pytest.approx(0.251, abs=5e-4)
    assert round(law.loss(280e9, 300e9), 3) == 1.993
    assert round(law.loss(70e9, 1.4e12), 3) == 1.937


def _brute_force_optimum(law, C, points=20001):
    """Minimise the loss along 6 N D = C over a fine grid of log N."""
    best = None
    for i in range(points):
        N = 10 ** (3 + 12 * i / (points - 1))
        loss = law.loss(N, C / (6 * N))
        if best is None or loss < best[0]:
            best = (loss, N)
    return best[1]


OTHER_LAW = scaling.ChinchillaLaw(E=2.0, A=100.0, B=900.0, alpha=0.5, beta=0.25)


@pytest.mark.parametrize("C", [1e18, 1e21, 5.76e23])
@pytest.mark.parametrize("law", [CHINCHILLA, OTHER_LAW])
def test_compute_optimal_closed_form_matches_a_brute_force_search(law, C):
    N, D = law.compute_optimal(C)
    assert 6 * N * D == pytest.approx(C)
    assert N == pytest.approx(_brute_force_optimum(law, C), rel=2e-3)


def test_tokens_per_parameter_grow_with_the_budget():
    ratios = [D / N for N, D in map(CHINCHILLA.compute_optimal, [1e18, 1e21, 5.76e23])]
    assert ratios[0] == pytest.approx(26, abs=0.5)      # not the familiar 20
    assert ratios[2] == pytest.approx(92, abs=1.5)      # at Chinchilla's budget
    assert ratios == sorted(ratios)


def test_kaplan_law_limits_and_units():
    k = scaling.KaplanLaw()
    assert k.loss_n(k.N_c) == pytest.approx(1.0)
    assert k.loss_d(k.D_c) == pytest.approx(1.0)
    assert k.loss_c(k.C_c * scaling.PF_DAY) == pytest.approx(1.0)
    assert scaling.PF_DAY == 8.64e19
    assert k.loss_n(1e9) > k.loss_n(1e10)
    # doubling N lowers L(N) by the factor 2^-alpha_N
    assert k.loss_n(2e9) / k.loss_n(1e9) == pytest.approx(2 ** -k.alpha_N)


def test_kaplan_nd_law_has_table_2s_constants_and_allocation():
    """Equation 1.5 with Table 2's fit (alpha_N 0.076, alpha_D 0.103, N_c 6.4e13, D_c 1.8e13), not the
    one-variable laws' constants: minimised along 6 N D = C, N_opt ~ C^0.575 and D / N falls from
    about 8.6 tokens per parameter at 1e19 FLOPs to 1.1 at 1e25 (worked by hand: N^(1 + r) =
    r N_c^r C / (6 D_c) with r = 0.076 / 0.103)."""
    law = scaling.KaplanNDLaw()
    assert (law.alpha_N, law.alpha_D, law.N_c, law.D_c) == (0.076, 0.103, 6.4e13, 1.8e13)
    assert law.size_exponent == pytest.approx(0.575, abs=5e-4)
    budgets = [1e19, 1e21, 1e23, 1e25]
    ratios = [D / N for N, D in map(law.compute_optimal, budgets)]
    assert ratios == pytest.approx([8.6, 4.3, 2.1, 1.1], abs=0.05)
    for C in budgets:
        N, D = law.compute_optimal(C)
        assert 6 * N * D == pytest.approx(C)
        assert N == pytest.approx(_brute_force_optimum(law, C), rel=2e-3)
    _, a = scaling.fit_power_law(budgets, [law.compute_optimal(C)[0] for C in budgets])
    assert a == pytest.approx(law.size_exponent)
    # with unlimited data it is a power law in N alone, with Table 2's N_c (not L(N)'s 8.8e13)
    assert law.loss(1e9, 1e30) == pytest.approx((6.4e13 / 1e9) ** 0.076, rel=1e-6)
    assert law.loss(1e40, 1e10) == pytest.approx((1.8e13 / 1e10) ** 0.103, rel=1e-6)


def _runs(law, Ns, Ds):
    return [(N, D, law.loss(N, D)) for N in Ns for D in Ds]


def test_fit_chinchilla_recovers_a_known_law():
    truth = scaling.ChinchillaLaw(E=1.8, A=300.0, B=500.0, alpha=0.3, beta=0.35)
    N, D, L = zip(*_runs(truth, [1e5, 1e6, 1e7, 1e8, 1e9], [1e7, 1e8, 1e9, 1e10, 1e11]), strict=True)
    fit = scaling.fit_chinchilla(N, D, L)
    for name in ("E", "A", "B", "alpha", "beta"):
        assert getattr(fit, name) == pytest.approx(getattr(truth, name), rel=1e-3), name


def test_fit_chinchilla_shrugs_off_an_outlier():
    truth = scaling.ChinchillaLaw(E=1.8, A=300.0, B=500.0, alpha=0.3, beta=0.35)
    N, D, L = (list(v) for v in zip(*_runs(truth, [1e5, 1e6, 1e7, 1e8], [1e7, 1e8, 1e9, 1e10]), strict=True))
    L[5] *= 1.5  # one diverged run
    fit = scaling.fit_chinchilla(N, D, L)
    assert fit.alpha == pytest.approx(0.3, rel=0.02)
    assert fit.loss(1e10, 1e12) == pytest.approx(truth.loss(1e10, 1e12), rel=0.01)


def test_isoflop_optimum_finds_a_parabolas_vertex_and_the_laws_optimum():
    Ns = [1e6, 3e6, 1e7, 3e7, 1e8]
    vertex = 5e6
    losses = [2.0 + 0.1 * (math.log(N) - math.log(vertex)) ** 2 for N in Ns]
    assert scaling.isoflop_optimum(Ns, losses) == pytest.approx(vertex, rel=1e-9)
    # an IsoFLOP profile of the Chinchilla law, sampled around its optimum
    C = 1e20
    N_opt, _ = CHINCHILLA.compute_optimal(C)
    Ns = [N_opt * 2.0**k for k in range(-3, 4)]
    found = scaling.isoflop_optimum(Ns, [CHINCHILLA.loss(N, C / (6 * N)) for N in Ns])
    assert found == pytest.approx(N_opt, rel=0.05)


def test_approach_2_recovers_the_laws_exponent():
    budgets = [1e18, 1e19, 1e20, 1e21]
    optima = []
    for C in budgets:
        centre, _ = CHINCHILLA.compute_optimal(C)
        Ns = [centre * 2.0**k for k in range(-2, 3)]
        optima.append(scaling.isoflop_optimum(Ns, [CHINCHILLA.loss(N, C / (6 * N)) for N in Ns]))
    _, a = scaling.fit_power_law(budgets, optima)
    assert a == pytest.approx(CHINCHILLA.beta / (CHINCHILLA.alpha + CHINCHILLA.beta), abs=0.01)


def test_fit_power_law_and_fit_kaplan_n_recover_known_constants():
    assert scaling.fit_power_law([1, 2, 4, 8], [3, 6, 12, 24]) == pytest.approx((3.0, 1.0))
    k, a = scaling.fit_power_law([1e3, 1e4, 1e5], [5 * 1e3**-0.2, 5 * 1e4**-0.2, 5 * 1e5**-0.2])
    assert (k, a) == pytest.approx((5.0, -0.2))
    truth = scaling.KaplanLaw(alpha_N=0.07, N_c=1e13)
    Ns = [1e5, 1e6, 1e7, 1e8]
    fit = scaling.fit_kaplan_n(Ns, [truth.loss_n(N) for N in Ns])
    assert fit.alpha_N == pytest.approx(0.07)
    assert fit.N_c == pytest.approx(1e13, rel=1e-6)


def test_bad_input_fails_clearly():
    with pytest.raises(ValueError, match="N must be positive"):
        CHINCHILLA.loss(0, 1e9)
    with pytest.raises(ValueError, match="D must be positive"):
        scaling.KaplanNDLaw().loss(1e9, -1)
    with pytest.raises(ValueError, match="C must be positive"):
        scaling.KaplanNDLaw().compute_optimal(-1)
    with pytest.raises(ValueError, match="C must be positive"):
        CHINCHILLA.compute_optimal(0)
    with pytest.raises(ValueError, match="one value per run"):
        scaling.fit_chinchilla([1, 2, 3, 4, 5], [1, 2, 3, 4], [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="at least 5 runs"):
        scaling.fit_chinchilla([1, 2], [1, 2], [1, 2])
    with pytest.raises(ValueError, match="no minimum"):
        scaling.isoflop_optimum([1e6, 1e7, 1e8], [1.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="at least 3 runs"):
        scaling.isoflop_optimum([1e6, 1e7], [1.0, 2.0])
    with pytest.raises(ValueError, match="does not fall"):
        scaling.fit_kaplan_n([1e6, 1e7], [1.0, 2.0])


def test_a_tiny_sweep_runs_end_to_end_and_resumes(tmp_path):
    path = tmp_path / "sweep.csv"
    first = scaling.sweep(path, scaling.QUICK_PLAN[:2], max_chars=200_000, progress=False)
    assert [r["size"] for r in first] == ["L2-D16", "L2-D32"]
    # the command line finishes the plan: only the run that is missing is trained
    assert scaling.main(["sweep", "--quick", "--out", str(path)]) == 0
    rows = scaling.read_sweep(path)
    assert [(r["budget"], r["size"], r["held_out"]) for r in rows] == [
        (r.budget, r.size, r.held_out) for r in scaling.QUICK_PLAN]
    assert scaling.sweep(path, scaling.QUICK_PLAN, progress=False) == []  # nothing left to do
    for row in rows:
        gpt = model.GPT(scaling.sweep_config(row["size"]))
        assert row["params"] == gpt.num_params()
        assert row["non_embedding"] == gpt.num_params(non_embedding=True)
        assert row["compute"] == 6 * row["params"] * row["tokens"]
        assert row["tokens"] % (32 * 64) == 0
        assert abs(row["compute"] / row["budget"] - 1) < 0.3  # whole steps of 32 x 64 tokens
        assert row["curve"][-1] == (row["tokens"], pytest.approx(row["loss"], abs=1e-4))
        assert row["loss"] < math.log(256)  # better than uniform over bytes


def test_sweep_rejects_unknown_sizes(tmp_path):
    with pytest.raises(ValueError, match="unknown sizes"):
        scaling.sweep(tmp_path / "x.csv", [scaling.Run(1e9, "huge")], progress=False)


def test_shipped_sweep_covers_the_plan_and_more_compute_gives_lower_loss():
    rows = scaling.read_sweep()
    assert sorted((r["budget"], r["size"], r["held_out"]) for r in rows) == sorted(
        (r.budget, r.size, r.held_out) for r in scaling.SWEEP_PLAN)
    best = {}
    for row in rows:
        assert abs(row["compute"] / row["budget"] - 1) < 0.05
        if not row["held_out"]:
            best[row["budget"]] = min(best.get(row["budget"], math.inf), row["loss"])
    losses = [best[b] for b in sorted(best)]
    assert losses == sorted(losses, reverse=True) and losses[-1] < 2.5
