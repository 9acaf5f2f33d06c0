"""ZB-V and DualPipeV as action lists (planner.simulate.zero_bubble): torch's own orders, the
makespans at unit times against the papers' bubbles, and peak activations against each
schedule's memory rule."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.cost.memory import in_flight_micro_batches
from planner.simulate.actions import GENERATORS, ScheduleError, StageTimes, execute, generate

CHUNK = StageTimes(forward_s=1, backward_input_s=1, backward_weight_s=1)   # per chunk: F = I = W = 1
RANK_HALF = StageTimes(forward_s=0.5, backward_input_s=0.5, backward_weight_s=0.5)  # a rank's unit work, halved


def test_registered_with_two_chunks():
    assert GENERATORS["zb-v"].default_chunks == 2 and GENERATORS["dualpipev"].default_chunks == 2
    for name in ("zb-v", "dualpipev"):
        sched = generate(name, 3, 6)
        assert sched.stage_map == "v" and sched.chunks == 2
        with pytest.raises(ScheduleError, match="two chunks per rank"):
            generate(name, 3, 6, 3)
    with pytest.raises(ScheduleError, match="at least 2 x 3 ranks = 6 micro-batches"):
        generate("dualpipev", 3, 5)


# ---------------------------------------------------------------- torch's own orders

torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")


def _torch_v_order(cls, p: int, m: int) -> list[list[str]]:
    """``pipeline_order`` of a torch V schedule on stand-in stages (nothing run), per rank, as
    ``<stage><kind><micro-batch>``; an ``OVERLAP_F_B`` action is its sub-actions in order (F then
    B), which is how torch's runtime executes it without a registered overlap function."""
    stages = [SimpleNamespace(num_stages=2 * p, group_size=p, group_rank=0, stage_index=s,
                              is_first=s == 0, is_last=s == 2 * p - 1, submod=None) for s in (0, 2 * p - 1)]
    sched = cls(stages, m)
    out = []
    for r in range(p):
        row = []
        for a in sched.pipeline_order[r]:
            if a is None:
                continue
            if a.sub_actions:
                row.extend(str(s) for s in a.sub_actions)
            elif a.computation_type.value in ("F", "B", "I", "W"):
                row.append(str(a))
        out.append(row)
    return out


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8])
def test_zb_v_is_torchs_zbv_zero_bubble(p):
    for m in (1, 2, p, 2 * p - 1, 2 * p, 2 * p + 3, 4 * p):
        assert generate("zb-v", p, m).table() == _torch_v_order(torch_schedules.ScheduleZBVZeroBubble, p, m), (p, m)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8])
def test_dualpipev_is_torchs_dualpipev(p):
    for m in (2 * p, 2 * p + 1, 3 * p, 4 * p + 2):
        assert generate("dualpipev", p, m).table() == _torch_v_order(torch_schedules.ScheduleDualPipeV, p, m), (p, m)
    # torch's own rule, the one the generator and the plan check use
    with pytest.raises(ValueError, match="at least as many microbatches as stages"):
        _torch_v_order(torch_schedules.ScheduleDualPipeV, p, 2 * p - 1)


def test_dualpipev_overlapped_pairs_are_f_then_b():
    # Each of torch's OVERLAP_F_B actions is a forward and a full backward of two different
    # chunks, and here those two run back to back in that order.
    p, m = 3, 8
    sched = torch_schedules.ScheduleDualPipeV(
        [SimpleNamespace(num_stages=2 * p, group_size=p, group_rank=0, stage_index=s, is_first=s == 0,
                         is_last=s == 2 * p - 1, submod=None) for s in (0, 2 * p - 1)], m)
    ours = generate("dualpipev", p, m).table()
    pairs = 0
    for r in range(p):
        for a in sched.pipeline_order[r]:
            if a is not None and a.sub_actions:
                f, b = (str(s) for s in a.sub_actions)
                assert "F" in f and "B" in b
                i = ours[r].index(f)
                assert ours[r][i + 1] == b
                pairs += 1
    # two per main-phase step and one per B1 F1 B0 step; the last rank's first pair is not
    # overlapped in torch (it is the same F, B here)
    assert pairs == sum(2 * (m - 2 * p + r + 1) + (p - r - 1) for r in range(p)) - 1


# ---------------------------------------------------------------- unit times

def _span_gaps(run) -> list[float]:
    """Per rank: idle time between its first start and its last end."""
    out = []
    for r in range(run.schedule.num_ranks):
        acts = run.rank_actions(r)
        out.append(max(a.end_s for a in acts) - min(a.start_s for a in acts) - run.busy_s[r])
    return out


def test_issue_figures_p4_m8():
    # Every schedule at the same work per rank (F = I = W = 1 for a whole rank, a V chunk half
    # of it): 1F1B 33, ZB-H1 27, ZB-V and DualPipeV 25.5 (docs/schedules.md).
    unit = StageTimes(1, 1, 1)
    assert execute(generate("1f1b", 4, 8), unit).makespan_s == 33
    assert execute(generate("zb-h1", 4, 8), unit).makespan_s == 27
    assert execute(generate("zb-v", 4, 8), RANK_HALF).makespan_s == 25.5
    assert execute(generate("dualpipev", 4, 8), RANK_HALF).makespan_s == 25.5


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6, 8])
def test_zb_v_zero_bubble_inside_each_rank(p):
    # Qi et al.: at T_F = T_B = T_W ZB-V has no bubble.  Measured: from m >= 2p - 1 on no rank
    # idles between its first and its last action; the makespan 6m + p - 1 (chunk units) is the
    # parallelogram's skew, the p - 1 forwards before the last rank can start, which the paper
    # hides across iterations with its optimizer post-validation (not modelled here).
    for m in range(1, 4 * p + 1):
        run = execute(generate("zb-v", p, m), CHUNK)
        assert run.makespan_s == 6 * m + max(p - 1, 4 * p - 2 * m - 2), (p, m)
        if m >= 2 * p - 1:
            assert max(_span_gaps(run)) == 0, (p, m)
        assert run.busy_s == [6.0 * m] * p


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6, 8])
def test_dualpipev_bubble(p):
    # DualPipeV: (p - 1) chunk units over the work, constant in m (DualPipe's bubble does not grow
    # with the micro-batches, DeepSeek-V3 §3.2.1), and not zero inside a rank's span.
    for m in range(2 * p, 4 * p + 3):
        run = execute(generate("dualpipev", p, m), CHUNK)
        assert run.makespan_s == 6 * m + p - 1, (p, m)
        assert max(_span_gaps(run)) == p - 1


def test_v_schedules_beat_zb_h1_at_equal_rank_work():
    unit = StageTimes(1, 1, 1)
    for p, m in ((2, 4), (4, 8), (4, 16), (8, 16)):
        zb_h1 = execute(generate("zb-h1", p, m), unit).makespan_s
        for name in ("zb-v", "dualpipev"):
            assert execute(generate(name, p, m), RANK_HALF).makespan_s < zb_h1


# ---------------------------------------------------------------- memory rules

@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
def test_zb_v_peak_activations(p):
    # Chunk micro-batches held (F done, W not yet) per rank: min(2p, m + r + 1, 2m), at most 2p
    # chunk halves = p whole-stage micro-batches, 1F1B's rank-0 peak (Qi et al.: ZB-V has
    # 1F1B's activation memory).  W follows I at once, so the count up to I is the same.
    for m in range(1, 3 * p + 2):
        run = execute(generate("zb-v", p, m), CHUNK)
        want = [min(2 * p, m + r + 1, 2 * m) for r in range(p)]
        assert run.peak_in_flight == want, (p, m)
        assert run.peak_before_input_grad == want
        assert [in_flight_micro_batches("zb-v", p, r, m, 2) for r in range(p)] == [w / 2 for w in want]
        one = execute(generate("1f1b", p, m), StageTimes(1, 1, 1)).peak_in_flight
        assert max(want) / 2 <= max(one)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
def test_dualpipev_peak_activations(p):
    # 2p + 1 chunk micro-batches on every rank, p + 1/2 whole-stage ones: DualPipe's "PP + 1"
    # chunk activations (DeepSeek-V3 Table 2) with PP = 2p chunks per V.
    for m in range(2 * p, 4 * p + 1):
        run = execute(generate("dualpipev", p, m), CHUNK)
        assert run.peak_in_flight == [2 * p + 1] * p, (p, m)
        assert [in_flight_micro_batches("dualpipev", p, r, m, 2) for r in range(p)] == [p + 0.5] * p
