"""The reference runner on BitPipe plans against the single-process run (as
tests/test_run_slow.py): after 3 steps in float64 the loss and every parameter agree to 1e-5,
and the two weight copies of every block (rank r and rank p-1-r) end equal.

- 2 stages, 2 processes, tied embeddings (both ends of each pipeline on one rank, so the
  tied matrix is one tensor per copy and the pair sum covers it);
- 4 stages, 7 processes, untied swiglu with grouped-query attention: stage 0 in tp 2 paired
  with stage 3 in tp 1 (the leaders sum full gradients), stages 1 and 2 each in two replicas
  of uneven shares (every shard summed over four ranks)."""

from __future__ import annotations

import pytest
from test_run_slow import GELU, STEPS, SWIGLU_GQA, _reference, assert_matches_reference, make_plan, rep

pytestmark = pytest.mark.slow

PLAN_BP2 = make_plan(GELU, [((0, 2), [rep(1, 2, ["b:0"])]), ((2, 4), [rep(1, 2, ["b:1"])])],
                     mbs=2, nmb=4, schedule="bitpipe")

PLAN_BP4 = make_plan({**SWIGLU_GQA, "name": "tiny-swiglu-8", "num_layers": 8}, [
    ((0, 2), [rep(2, 3, ["c:0", "c:1"])]),
    ((2, 4), [rep(1, 2, ["c:2"]), rep(1, 1, ["c:3"])]),
    ((4, 6), [rep(1, 1, ["c:4"]), rep(1, 2, ["c:5"])]),
    ((6, 8), [rep(1, 3, ["c:6"])]),
], mbs=3, nmb=4, schedule="bitpipe")


def _run(plan):
    from planner.launch import runner

    seen = []
    result = runner.run_plan(plan, steps=STEPS, dtype="float64", return_params=True,
                             on_step=lambda *a: seen.append(a))
    # The live progress sums both pipelines' losses, as the result does.
    assert seen == list(zip(range(STEPS), result.losses, result.step_time_s))
    return result, _reference(plan)


@pytest.mark.parametrize("plan", [PLAN_BP2, PLAN_BP4], ids=["2-stage", "4-stage"])
def test_bitpipe_matches_single_process_reference(plan):
    result, reference = _run(plan)
    assert_matches_reference(result, reference)
    # Every block is held twice (runner._collect compares the copies): they stay equal.
    assert result.replica_max_abs_diff == 0.0
