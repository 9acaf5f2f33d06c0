"""One layout, several schedules: a plan found for one knob tuple is also a plan of its *twins*,
the tuples with the same micro-batches, recompute, ZeRO, stages and degrees under another
schedule of the space (docs/search-space.md, "Twin schedules").

Under GPipe, 1F1B, interleaved 1F1B and ZB-H1 stage ``s`` of a layout holds the same blocks on
the same devices, with the embedding on the first stage and the head on the last, so its
per-micro-batch times, sends, gradient sync and optimizer step are the same; only the
schedule's time and its activations in flight (memory per position) differ.  Pricing a found
layout under each twin costs one small CoreProblem, where a twin's own warm-start MILP costs
seconds: ZB-H1's rows only bound its time (schedules.py), and on bench scenario c its
capped MILPs (p = 6-8, three micro-batches) found no plan in 2-3 s each, while the 1F1B-family
tuple of the same stage count found the answer's layout.  The V schedules (zb-v, dualpipev)
are not twins: their stages map to ranks in a V with the head on rank 0, another layout.
"""

from __future__ import annotations

# schedules whose stage s is the same set of blocks on the same devices (module docstring)
TWIN_SCHEDULES = frozenset({"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"})
# twins whose rows only bound their time, and whose warm start goes through an exact twin
BOUND_ONLY_TWINS = frozenset({"zb-h1"})


def twin_key(knobs) -> tuple:
    """What twins share: every knob but the schedule and its virtual stages (a tuple, not a
    dataclasses.replace: the index is built over every ranked tuple, 35,000 on bench c;
    tests/test_search_twins.py holds it to Knobs' fields).  twins.py's dominance rules pair
    tuples by it too."""
    return (knobs.micro_batch_size, knobs.num_micro_batches, knobs.recompute, knobs.zero_stage, knobs.num_stages,
            knobs.reshard_after_forward, knobs.context_parallel, knobs.expert_parallel, knobs.zero_shard_degree)


def twin_index(ranked) -> dict:
    """twin key -> the ranked tuples (queue.Ranked) of a twin schedule with two or more
    stages (one stage: ZB-H1 is 1F1B and GPipe is left out, twins.py)."""
    out: dict = {}
    for item in ranked:
        if item.knobs.schedule in TWIN_SCHEDULES and item.knobs.num_stages >= 2:
            out.setdefault(twin_key(item.knobs), []).append(item)
    return out


def twins_of(index: dict, knobs) -> list:
    """The ranked twins of ``knobs`` (not itself)."""
    if knobs.schedule not in TWIN_SCHEDULES:
        return []
    return [t for t in index.get(twin_key(knobs), ()) if t.knobs != knobs]


def has_exact_twin(index: dict, knobs) -> bool:
    """Whether a twin whose rows are its time (not a bound) is in the space."""
    return any(t.knobs.schedule not in BOUND_ONLY_TWINS for t in twins_of(index, knobs))


def twin_assign(prob, layout, block_unit: int) -> list | None:
    """``layout`` ([(OptionKey, blocks)] per stage) over ``prob`` 's options in core units of
    ``block_unit`` blocks; None where an option is missing or a stage's blocks do not split
    into the twin's units (interleaving needs each stage's blocks in v chunks)."""
    index = {o.label: i for i, o in enumerate(prob.options)}
    if any(k not in index or nb % block_unit for k, nb in layout):
        return None
    return [(index[k], nb // block_unit) for k, nb in layout]
