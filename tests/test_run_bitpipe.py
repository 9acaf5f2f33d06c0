"""Fast checks of how the reference runner lays out a BitPipe plan (torch-free): the generated
lists with their two pipelines, the model cut along both pipelines (every block on a rank and
its mirror), which stages hold the loss, the worker config round trip, the memory check's
in-flight counts and second weight copy, and the chunk check of an override."""

from __future__ import annotations

import subprocess

import pytest
from test_run_checks import TINY, make_plan, rep

from planner.errors import InputError
from planner.launch import run_schedule, runner
from planner.simulate.actions import generate


@pytest.fixture
def no_spawn(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a process was started")
    monkeypatch.setattr(subprocess, "Popen", boom)


def bitpipe_plan(blocks, nmb=4, model=TINY):
    stages = [((a, b), [rep(1, 4, [f"n:{i}"])]) for i, (a, b) in enumerate(blocks)]
    return make_plan(stages, mbs=4, nmb=nmb, schedule="bitpipe", model=model)


def test_bitpipe_plan_runs_the_generated_lists_with_their_pipelines(no_spawn):
    plan = bitpipe_plan([(0, 2), (2, 4)])
    sched = runner.check_plan(plan, runner.model_shape(plan))
    assert sched == generate("bitpipe", 2, 4)
    assert sched.pipelines == ((0, 1), (2, 3))
    assert runner.head_stages(sched) == {0, 1}
    # The worker gets the pipelines too (a Schedule without them would not build).
    assert run_schedule.schedule_from_json(run_schedule.schedule_to_json(sched)) == sched


def test_chunks_of_both_pipelines_put_every_block_on_a_rank_and_its_mirror():
    # 6 blocks: stage 0 holds 2 (chunks of 1), stage 1 holds 4 (chunks of 2).  Down V: stages
    # 0..3 on ranks 0, 1, 1, 0; the up pipeline mirrors it: ranks 1, 0, 0, 1, same blocks.
    plan = bitpipe_plan([(0, 2), (2, 6)], model={**TINY, "num_layers": 6})
    chunks = runner.model_chunks(plan)
    assert [(c["stage"], c["chunk"], c["blocks"], c["embedding"], c["head"]) for c in chunks] == [
        (0, 0, [0, 1], True, False), (1, 0, [1, 3], False, False),
        (1, 1, [3, 5], False, False), (0, 1, [5, 6], False, True),
        (1, 2, [0, 1], True, False), (0, 2, [1, 3], False, False),
        (0, 3, [3, 5], False, False), (1, 3, [5, 6], False, True)]


def test_four_stages_pair_each_rank_with_its_mirror():
    plan = bitpipe_plan([(2 * i, 2 * i + 2) for i in range(4)], model={**TINY, "num_layers": 8})
    sched = run_schedule.plan_schedule(plan)
    chunks = runner.model_chunks(plan, sched)
    held = {r: sorted(b for c in chunks if c["stage"] == r for b in range(*c["blocks"])) for r in range(4)}
    # One block per chunk, block k = stage k: rank 0 runs down stages 0 and 7 and, in the up
    # pipeline, rank 3's down stages 3 and 4; ranks 1 and 2 likewise.
    assert held == {0: [0, 3, 4, 7], 1: [1, 2, 5, 6], 2: [1, 2, 5, 6], 3: [0, 3, 4, 7]}
    assert [run_schedule.weight_stages(sched, r) for r in range(4)] == [(0, 3), (1, 2), (1, 2), (0, 3)]
    assert runner.head_stages(sched) == {0, 3}
    # Every slot's chunk is the one the schedule's map puts there.
    assert all((c["stage"], c["chunk"]) == sched.owner(k % 8, 0 if k < 8 else 2)
               for k, c in enumerate(chunks))


def test_peak_in_flight_counts_a_bitpipe_chunk_as_half_a_stage():
    sched = generate("bitpipe", 2, 4)
    counts = []
    for acts in sched.ranks:
        held = top = 0
        for a in acts:
            held += 1 if a.kind == "F" else -1
            top = max(top, held)
        counts.append(top)
    assert run_schedule.peak_in_flight(sched) == [c / 2 for c in counts]
    assert max(counts) > 2      # the order does hold several chunks at once


def test_memory_check_counts_the_second_weight_copy():
    """runner._bytes_per_rank's rule on a bitpipe plan: each rank keeps weights, gradients and
    two Adam moments of both copies (its 2 blocks and its mirror's 2, and both ends, as rank 0
    and rank 1 each run a pipeline's embedding and head), and the peak chunk activations of
    the lists at half a stage each, the head's logits included on both."""
    plan = bitpipe_plan([(0, 2), (2, 4)])
    shape = runner.model_shape(plan)
    sched = run_schedule.plan_schedule(plan)
    h, f, v, seq, heads = (shape[k] for k in ("hidden_size", "ffn_size", "vocab_size", "seq_len", "num_heads"))
    block = 4 * h * h + 3 * h * f
    weights = 4 * (4 * block + 2 * v * h)
    per_stage = 2 * 4 * seq * (12 * h + 3 * f + 3 * heads * seq) + 3 * 4 * seq * v
    want = (weights + max(run_schedule.peak_in_flight(sched)) * per_stage) * 8
    assert runner._bytes_per_rank(plan, shape, 8, sched) == want
    # One copy (the same layout under 1F1B) is less by the second copy's two blocks at least.
    one = make_plan([((0, 2), [rep(1, 4, ["n:0"])]), ((2, 4), [rep(1, 4, ["n:1"])])], mbs=4, nmb=4)
    assert want - runner._bytes_per_rank(one, shape, 8, run_schedule.plan_schedule(one)) >= 4 * 2 * block * 8


def test_a_bitpipe_override_needs_stages_that_cut_in_two(no_spawn):
    plan = make_plan([((0, 1), [rep(1, 4, ["a:0"])]), ((1, 4), [rep(1, 4, ["b:0"])])], nmb=4)
    with pytest.raises(InputError, match=r"stages\[0\].blocks: 1 blocks do not split into the "
                                         r"schedule's 2 chunks per pipeline"):
        runner.run_plan(plan, schedule=generate("bitpipe", 2, 4))
