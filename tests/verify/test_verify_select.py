"""The selection rules on hand-made scores (every tie-break level of the hybrid), and Best@k / Pass@k on hand-made
candidates with hand-computed values."""

import random

import pytest

from patchgym.verify.select import Candidate, best_at_k, choose, selection_curves, subsets, tie_key


def c(id, p=None, reg=None, repro=None, resolved=False):
    return Candidate(id, resolved, p, reg, repro)


def test_hybrid_keeps_the_top_half_by_p_yes_before_counting_tests():
    # "c" passes the most regression tests but is in the bottom half by P(YES).
    pool = [c("a", 0.9, 5, 0), c("b", 0.8, 7, 0), c("c", 0.3, 10, 9), c("d", 0.2, 1, 0)]
    assert choose(pool, "hybrid").id == "b"
    assert choose(pool, "eb").id == "c"
    assert choose(pool, "ef").id == "a"


def test_hybrid_breaks_a_regression_tie_by_reproduction_score():
    pool = [c("a", 0.9, 7, 1), c("b", 0.8, 7, 2), c("c", 0.1, 3, 5), c("d", 0.0, 3, 5)]
    assert choose(pool, "hybrid").id == "b"


def test_hybrid_breaks_a_test_tie_by_p_yes():
    pool = [c("b", 0.8, 7, 2), c("a", 0.9, 7, 2), c("c", 0.1, 7, 2), c("d", 0.0, 7, 2)]
    assert choose(pool, "hybrid").id == "a"


def test_hybrid_breaks_a_full_tie_by_the_id_hash_whatever_the_order():
    # sha256 orders these run1/t#0 < run0/t#0 < run0/t#1: the smallest id would always favour the run named first.
    assert sorted(["run0/t#0", "run0/t#1", "run1/t#0"], key=lambda i: tie_key(c(i))) == [
        "run1/t#0", "run0/t#0", "run0/t#1"]
    pool = [c("run1/t#0", 0.5, 3, 1), c("run0/t#1", 0.5, 3, 1), c("run0/t#0", 0.5, 3, 1), c("run9/t#9", 0.1, 3, 1)]
    for seed in range(5):
        random.Random(seed).shuffle(pool)
        assert choose(pool, "hybrid").id == "run1/t#0"
        assert choose(pool, "ef").id == "run1/t#0"
        assert choose(pool, "eb").id == "run1/t#0"


def test_a_tie_at_the_top_half_cut_keeps_the_smaller_tie_keys():
    # Three share P(YES) 0.5 and two places; by id hash c < b < a, so "c" and "b" stay and "a" (most passes) is out.
    pool = [c("a", 0.5, 9, 0), c("b", 0.5, 2, 0), c("c", 0.5, 1, 0), c("d", 0.1, 9, 0)]
    assert choose(pool, "hybrid").id == "b"


def test_unmeasured_scores_rank_below_measured_ones():
    pool = [c("a", 0.9, None, None), c("b", 0.8, 0, 0), c("c", 0.1, None, None), c("d", 0.0, None, None)]
    assert choose(pool, "hybrid").id == "b"
    assert choose(pool, "eb").id == "b"
    assert choose([c("a", None), c("b", 0.1)], "ef").id == "b"


def test_one_candidate_is_always_chosen():
    assert choose([c("only", 0.0, 0, 0)], "hybrid").id == "only"
    with pytest.raises(ValueError):
        choose([], "hybrid")
    with pytest.raises(ValueError, match="unknown verifier"):
        choose([c("a")], "best")


HAND = {
    # ef picks the highest P(YES); T1: 2 of 3 resolve, but the top pick does not.
    "T1": [c("a", 0.9, resolved=False), c("b", 0.5, resolved=True), c("c", 0.1, resolved=True)],
    "T2": [c("x", 0.2, resolved=True), c("y", 0.7, resolved=False), c("z", 0.6, resolved=False)],
}


def test_best_at_k_and_pass_at_k_by_hand():
    # T1: best@1 = 2/3; best@2 over {a,b} {a,c} {b,c} picks a, a, b = 1/3; best@3 picks a = 0.
    assert best_at_k(HAND["T1"], "ef", 1, 100, 0) == pytest.approx(2 / 3)
    assert best_at_k(HAND["T1"], "ef", 2, 100, 0) == pytest.approx(1 / 3)
    assert best_at_k(HAND["T1"], "ef", 3, 100, 0) == 0.0
    # T2: best@1 = 1/3; pairs {x,y} {x,z} {y,z} pick y, z, y = 0.
    assert best_at_k(HAND["T2"], "ef", 2, 100, 0) == 0.0
    curves = selection_curves(HAND, "ef", [1, 2, 3, 4])
    assert curves["best@1"] == pytest.approx(0.5) and curves["pass@1"] == pytest.approx(0.5)
    assert curves["best@2"] == pytest.approx(1 / 6)
    # pass@2: T1 1 - C(1,2)/C(3,2) = 1, T2 1 - C(2,2)/C(3,2) = 2/3.
    assert curves["pass@2"] == pytest.approx(5 / 6)
    assert curves["best@3"] == 0.0 and curves["pass@3"] == 1.0
    assert curves["best@4"] is None and curves["pass@4"] is None
    assert "2 of 2 tasks have fewer than 4 candidates" in curves["null_k"]["4"]


def test_best_at_k_averages_over_subsets_exactly_or_seeded_at_random():
    # The one resolved candidate has the top P(YES): ef picks it iff it is drawn, k/n of the time.
    pool = [c(f"t#{i}", 1.0 - i / 10, resolved=i == 0) for i in range(6)]
    assert best_at_k(pool, "ef", 3, 20, 0) == pytest.approx(0.5)  # C(6,3) = 20 subsets, all of them
    drawn = best_at_k(pool, "ef", 3, 7, "seed")  # 7 random subsets
    assert drawn == best_at_k(list(reversed(pool)), "ef", 3, 7, "seed")
    assert drawn * 7 == pytest.approx(round(drawn * 7))
    assert len(subsets(6, 3, 7, random.Random(0))) == 7 and len(subsets(6, 3, 20, random.Random(0))) == 20
