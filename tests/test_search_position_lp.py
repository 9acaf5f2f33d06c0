"""position_lp.PositionModel.reaches: the bisection's test without an LP where the last
solution shows it (packed.py), checked against a fresh LP on random models."""

from __future__ import annotations

import math
import random

import numpy as np


def _case(rng: random.Random, crossing: bool):
    from planner.search.position_lp import VARIANTS, Cross

    K, p = rng.randint(2, 6), rng.randint(2, 5)
    shape = (len(VARIANTS), K, p) if crossing else (K, p)
    most = np.array([rng.choice([0, 1, 2, 3, 5, 8]) for _ in range(int(np.prod(shape)))], dtype=float).reshape(shape)
    units = np.array([rng.randint(1, 3) for _ in range(K)], dtype=float)
    cls = np.array([rng.randrange(2) for _ in range(K)])
    cap = [rng.randint(2, 8), rng.randint(2, 8)]
    cross = Cross(2, rng.random() < 0.5) if crossing else None
    return most, units, cls, cap, cross


def test_reaches_agrees_with_the_lp_and_skips_it_where_the_last_solution_shows_it(monkeypatch):
    """Lowering ``most`` as a bisection does: whenever ``reaches`` says L blocks fit, a fresh
    LP says so too (the claim keeps the bottleneck's bound valid), it says no only where the
    LP does, and some answers come without an LP (else it saves nothing)."""
    from planner.search import position_lp
    from planner.search.position_lp import PositionLP, PositionModel

    runs = []
    run = PositionModel._run
    monkeypatch.setattr(PositionModel, "_run", lambda self, *a: runs.append(1) or run(self, *a))
    checked = skipped = 0
    for seed in range(150):
        rng = random.Random(seed)
        most, units, cls, cap, cross = _case(rng, crossing=seed % 3 == 0)
        model = position_lp.PositionLP().model(most, units, cls, cap, cross)
        if model is None:
            continue
        top = model.most_blocks(most)
        if not math.isfinite(top):
            continue
        for _ in range(4):
            most = np.maximum(0.0, most - (np.array([rng.random() for _ in range(most.size)]).reshape(most.shape) < 0.2))
            fresh = PositionLP().most_blocks(most, units, cls, cap, cross)
            near = {math.floor(fresh), math.floor(fresh) + 1} if math.isfinite(fresh) else set()
            for L in near | {math.floor(top)}:
                if L < 1:
                    continue
                runs.clear()
                got = model.reaches(most, L)
                assert got == (fresh >= L), (seed, L, got, fresh)
                checked += 1
                skipped += got and not runs
    assert checked >= 300 and skipped >= 30, (checked, skipped)
