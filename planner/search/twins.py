"""Knob tuples another one dominates (solve.py leaves them out): GPipe behind its 1F1B twin,
one-stage zb-h1 behind one-stage 1F1B.  Each rule says why the twin's best is at least as
good, so leaving the tuple out loses no plan and keeps every bound."""

from __future__ import annotations

from planner.search.twin_plans import twin_key


def gpipe_dominated(knobs_list: list, same_only: bool = False) -> set:
    """The GPipe tuples whose 1F1B twin (same micro-batches, recompute, ZeRO and stages) is in
    the space.  Every GPipe plan is a 1F1B plan of its twin at least as good: the same
    stages keep the same per-micro-batch times, syncs and steps; 1F1B's pipeline time
    ``sum_s c_s + (m-1) max_s c_s`` (c_s = f + b + both sends) is at most GPipe's
    ``sum_s (f + sf) + (m-1) max_s (f + sf) + sum_s (b + sb) + (m-1) max_s (b + sb)`` (a max of
    sums is at most the sum of the maxima; planner.cost.schedule), and 1F1B holds at most
    min(p - s, m) micro-batches in flight where GPipe holds m.  Prices are the same.  So the
    twin's best is at least as good for every objective the search prices (CPU core sharing,
    which only the final evaluate prices, is outside it), its bound bounds the GPipe tuple
    too, and with one plan asked for, the GPipe tuple is pruned.  With --top K
    (``same_only``) a GPipe plan may be among the K best and only the tuples whose plans
    repeat their twin's times go: one stage or one micro-batch (the same sums and maxima;
    1F1B holds one micro-batch in flight where GPipe holds m), which would list the same
    layout twice."""
    ones = {twin_key(k) for k in knobs_list if k.schedule == "1f1b"}
    return {k for k in knobs_list if k.schedule == "gpipe" and twin_key(k) in ones
            and (not same_only or k.num_stages == 1 or k.num_micro_batches == 1)}


def one_stage_zb_h1_twins(knobs_list: list) -> set:
    """The one-stage zb-h1 tuples whose 1F1B twin (same micro-batches, recompute, ZeRO) is in
    the space: with one stage ZB-H1 is 1F1B (the same rows, schedules.py, and one micro-batch
    in flight under both, planner.cost.in_flight_micro_batches), so each of its plans is the
    twin's at the same time and memory; kept, it would list the same layout twice."""
    ones = {twin_key(k) for k in knobs_list if k.schedule == "1f1b" and k.num_stages == 1}
    return {k for k in knobs_list if k.schedule == "zb-h1" and k.num_stages == 1 and twin_key(k) in ones}
