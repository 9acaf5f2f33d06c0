"""How far each knob-bound level lifts a bench scenario's lowest tuples, and what it costs
(docs/search-space.md, "Where a 16,384-GPU search's 30 s go").

    python scripts/bound_levels.py c 1.932 600

runs the scenario's search up to its heap (ranking and baselines; no warm start), then takes
the ``600`` tuples of least memory-free bound under ``1.932`` s (an incumbent: c's 30-s answer)
and climbs each through the levels the search climbs them through (memory-aware, the packed
bottleneck's knapsacks, its position LPs), stopping a tuple once it reaches the incumbent.
Prints per level how many reach it and the seconds spent.  Only a measurement: it changes nothing.
"""

from __future__ import annotations

import importlib
import math
import sys
import time

from planner.bench_scenarios import by_key, full_scenarios
from planner.search import solve
from planner.spec import Training, cluster_from_dict, load_model

LEVELS = ("memory-aware", "knapsack", "position LP")


class _Stop(Exception):
    pass


def climb(pending: list, knob_bound, incumbent_s: float, most: int) -> None:
    below = sorted((e for e in pending if e.value < incumbent_s), key=lambda e: e.value)
    print(f"{len(below)} tuples with a memory-free bound under {incumbent_s} s; climbing the {min(most, len(below))} least")
    reached, spent, asked = [0] * 3, [0.0] * 3, [0] * 3
    for e in below[:most]:
        bound = e.value
        for level in range(3):
            t0 = time.perf_counter()
            bound = max(bound, knob_bound(e.knobs, e.ctx, e.keys, enough=incumbent_s, packed=level))
            spent[level] += time.perf_counter() - t0
            asked[level] += 1
            if bound >= incumbent_s:
                reached[level] += 1
                break
    for level, name in enumerate(LEVELS):
        each = 1000 * spent[level] / asked[level] if asked[level] else math.nan
        print(f"{name:13s}: asked {asked[level]:4d}, reach the incumbent {reached[level]:4d}, "
              f"{spent[level]:6.1f} s ({each:.1f} ms each)")
    print(f"left under it after every level: {min(most, len(below)) - sum(reached)}")


def main(argv: list[str]) -> int:
    key, incumbent_s, most = argv[0], float(argv[1]), int(argv[2]) if len(argv) > 2 else 600
    sc = by_key(full_scenarios(), key)
    solver = importlib.import_module("planner.search.solve")
    captured = {}
    original_bound, original_heapify, original_warm = solver.KnobBound, solver.heapq.heapify, solver.warm_start

    class Recording(original_bound):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            captured["bound"] = self

    def heapify(pending):
        captured["bound"].set_deadline(math.inf)
        climb(pending, captured["bound"], incumbent_s, most)
        raise _Stop

    solver.KnobBound, solver.heapq.heapify, solver.warm_start = Recording, heapify, lambda *a, **k: None
    try:
        training = Training(global_batch_size=sc.global_batch_size, seq_len=sc.seq_len, precision=sc.precision)
        solve(cluster_from_dict(sc.cluster), load_model(sc.model), training, time_limit_s=3600)
    except _Stop:
        pass
    finally:
        solver.KnobBound, solver.heapq.heapify, solver.warm_start = original_bound, original_heapify, original_warm
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
