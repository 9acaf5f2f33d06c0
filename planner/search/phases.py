"""What a search in two phases shares (solve._pure_first, solve._per_node_too): the clock the
second phase's share is read in, its wall guard, and the plans of both, once each and their
counts added."""

from __future__ import annotations

import time
from contextlib import contextmanager

from planner.search.answer import SearchResult

PHASE_REST_MIN_SHARE = 0.3  # a second phase gets at least this share, whatever the first took
# a gap_rel from which any plan will do (hint_checks.ANY_PLAN): a second phase is not needed
ANY_PLAN_GAP = 1 - 1e-6

COUNTS = ("candidates", "knob_tuples", "knob_tuples_solved", "knob_tuples_pruned", "knob_tuples_infeasible",
          "knob_tuples_unexplored", "knob_tuples_too_big", "knob_tuples_gpipe_twins")


def distinct(result: SearchResult, topo, top_k: int) -> SearchResult:
    """``result`` less the plans that repeat an earlier one up to a swap of identical nodes: a
    plan of one view can be one of the other too (one stage on one node), and in the node view
    identical nodes are classes apart, so a layout on the second node repeats the first's."""
    seen, plans, evals = set(), [], []
    for plan, ev in zip(result.plans, result.evaluations):
        what = up_to_identical_nodes(plan, topo)
        if what not in seen:
            seen.add(what)
            plans.append(plan)
            evals.append(ev)
    result.plans, result.evaluations = plans[:top_k], evals[:top_k]
    return result


def up_to_identical_nodes(plan, topo) -> str:
    """The plan's layout (its JSON less solver, prediction, rank map and inputs) with each node
    named by its class and its order of first use in that class."""
    text = plan.model_dump_json(exclude={"solver", "predicted", "launch", "inputs"})
    alias: dict[str, str] = {}
    used: dict[tuple, int] = {}
    for st in plan.stages:
        for r in st.replicas:
            for device in r.devices:
                node = device.rpartition(":")[0]
                if node not in alias:
                    names = topo.node_class_of(node).node_names
                    used[names] = used.get(names, 0) + 1
                    alias[node] = f"{names[0]}#{used[names]}"
    for node, name in alias.items():
        text = text.replace(f'"{node}:', f'"{name}:')
    return text


def answer_found(first, second: dict, from_first: bool, wall_s: float) -> dict:
    """``answer_found_s`` of a two-phase search, from the start of the whole: the first phase's
    own, or the second's (``second``, its report as a dict) shifted by what ran before it."""
    found = (first.report.model_extra if from_first else second).get("answer_found_s")
    if found is None:
        return {}
    return {"answer_found_s": found if from_first else found + wall_s - second["wall_s"]}


def rest_of_limit(work, t0: float, time_limit_s: float) -> tuple[float, float]:
    """(what a first phase used, what the second gets): the rest of the limit in the clock the
    deadlines read (work under --deterministic), at least PHASE_REST_MIN_SHARE of it."""
    used = elapsed(work) - t0
    return used, max(time_limit_s - used, PHASE_REST_MIN_SHARE * time_limit_s)


@contextmanager
def own_wall_guard(work):
    """A second phase under a work clock: the first phase's wall guard (its share of the
    limit) is not the second's, which gets the whole search's, and the guard's flag is cleared
    for it (set, it left the second phase's MILPs no nodes while its clock still ran) and
    reported all the same."""
    wall_bound = work is not None and work.wall_clock_bound
    if work is not None:
        work.wall_clock_bound = False
    try:
        yield
    finally:
        if wall_bound:
            work.wall_clock_bound = True


def elapsed(work) -> float:
    """Seconds of the clock the deadlines read: the work done under a deterministic search's
    clock (not inf past its wall guard, as ``clock.now()`` is), else the wall clock."""
    return time.monotonic() if work is None else work.units * work.seconds_per_unit
