"""Choosing one candidate per task, and Best@k against the Pass@k oracle (docs/algorithms.md §6-7).

    ef:     the highest P(YES)
    eb:     the most regression passes, then the best reproduction score
    hybrid: the top half by P(YES) (at least one), then the most regression passes, then the best
            reproduction score, then the highest P(YES)     (DeepSWE / R2E-Gym create_bestofn_aggregate.py)

Every remaining tie goes to the candidate whose id has the smallest SHA-256 (`tie_key`): a choice never depends on
input order, and, unlike the smallest id, not on how the runs were named either (with ids "runA/t#0", "runB/t#0"
the smallest id would always favour runA). A score that could not be measured (None: an infra error) ranks below
every measured one.
"""

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from patchgym.eval.metrics import pass_at_k

VERIFIERS = ("ef", "eb", "hybrid")
_UNMEASURED = -math.inf


@dataclass(frozen=True)
class Candidate:
    """One trajectory's scores, keyed by its id (unique across the runs selected from)."""

    id: str
    resolved: bool
    p_yes: float | None = None
    regression: int | None = None
    repro: int | None = None


def tie_key(candidate: Candidate) -> str:
    return hashlib.sha256(candidate.id.encode()).hexdigest()


def _score(value: float | None) -> float:
    return _UNMEASURED if value is None else value


def _keep_max(candidates: list[Candidate], key) -> list[Candidate]:
    best = max(key(c) for c in candidates)
    return [c for c in candidates if key(c) == best]


def choose(candidates: Sequence[Candidate], verifier: str) -> Candidate:
    """The candidate `verifier` picks (see the module docstring)."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {', '.join(VERIFIERS)}")
    pool = sorted(candidates, key=tie_key)
    p_yes = lambda c: _score(c.p_yes)  # noqa: E731
    regression = lambda c: _score(c.regression)  # noqa: E731
    repro = lambda c: _score(c.repro)  # noqa: E731
    if verifier == "ef":
        pool = _keep_max(pool, p_yes)
    else:
        if verifier == "hybrid":
            # sorted() is stable: equal P(YES) at the cut keeps the smaller tie keys.
            pool = sorted(pool, key=p_yes, reverse=True)[:max(1, len(pool) // 2)]
        pool = _keep_max(pool, regression)
        pool = _keep_max(pool, repro)
        if verifier == "hybrid":
            pool = _keep_max(pool, p_yes)
    return min(pool, key=tie_key)


def subsets(n: int, k: int, limit: int, rng: random.Random) -> list[tuple[int, ...]]:
    """Every k-subset of range(n) when there are at most `limit`, else `limit` random ones (with repeats)."""
    if math.comb(n, k) <= limit:
        return list(combinations(range(n), k))
    return [tuple(sorted(rng.sample(range(n), k))) for _ in range(limit)]


def best_at_k(candidates: Sequence[Candidate], verifier: str, k: int, limit: int, seed: int | str) -> float:
    """For one task: the chance that the verifier's pick among k candidates resolves, averaged over k-subsets."""
    pool = sorted(candidates, key=lambda c: c.id)
    if not 1 <= k <= len(pool):
        raise ValueError(f"best@{k} needs 1 <= k <= {len(pool)} candidates")
    picks = [choose([pool[i] for i in subset], verifier).resolved
             for subset in subsets(len(pool), k, limit, random.Random(seed))]
    return sum(picks) / len(picks)


def selection_curves(by_task: Mapping[str, Sequence[Candidate]], verifier: str, ks: Sequence[int], *,
                     limit: int = 100, seed: int = 0) -> dict:
    """{"best@k": ..., "pass@k": ...} for each k, averaged over tasks; null (and a reason in "null_k") where some
    task has fewer than k candidates, so that every value is over the same tasks."""
    out: dict = {}
    reasons: dict[str, str] = {}
    for k in sorted(set(ks)):
        short = sorted(task for task, c in by_task.items() if len(c) < k)
        if short or not by_task:
            out[f"best@{k}"] = out[f"pass@{k}"] = None
            reasons[str(k)] = (f"{len(short)} of {len(by_task)} tasks have fewer than {k} candidates "
                               f"(e.g. {short[0]}: {len(by_task[short[0]])})" if short else "no tasks")
            continue
        best = [best_at_k(c, verifier, k, limit, f"{seed}:{task}:{k}") for task, c in sorted(by_task.items())]
        oracle = [pass_at_k(len(c), sum(x.resolved for x in c), k) for _, c in sorted(by_task.items())]
        out[f"best@{k}"] = sum(best) / len(best)
        out[f"pass@{k}"] = sum(oracle) / len(oracle)
    out["null_k"] = reasons
    return out
