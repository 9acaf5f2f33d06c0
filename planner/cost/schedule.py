"""Pipeline schedules in closed form, for stages of unequal speed.

Per stage s (``StageTiming``), for one micro-batch on the stage's slowest replica:
f_s = forward (compute + TP comm), b_s = backward (compute + recompute + TP comm),
sf_s = send of the activation to the next stage, sb_s = send of the gradient to the
previous stage.  Sends block the sender (Megatron's schedules wait on their p2p ops), so a
stage's cycle per micro-batch is c_s = f_s + b_s + sf_s + sb_s, and the first micro-batch's
trip through the whole pipeline (fill) is F = sum_s (f_s + b_s + sf_s + sb_s).

- 1F1B (PipeDream-Flush; Narayanan et al. SC21 §2.2):  T = F + (m-1) max_s c_s.
  Equal stages give the paper's (m + p - 1)(f + b), bubble fraction (p-1)/m.  Exact (equal
  to planner.simulate's event-driven makespan) for equal stages without sends, for p = 1
  and for m = 1.  Otherwise an estimate, above the simulator where every stage's backward
  is the longer pass (training's ~2x): when an early stage is the slowest, its warm-up
  forwards overlap the fill (p=2, f=b=(2,1), m=2: true 8, formula 10); in randomised tests
  (tests/test_cost_schedule_sim.py, f in [0.5, 2] and b in [1, 4], or b = 2f, with sends)
  it never fell below the simulator and stayed within ~27% above it.  Not a bound in
  general: stages whose forward dwarfs their backward can put it below (p=3, m=2, (f, b) =
  (1, 4), (4, 1), (1, 1): formula 17, true 18; 7.5% of 20,000 such skewed cases, up to 22%
  below).  With sends on equal stages it is within one send time.
- GPipe (Huang et al. 2019): all forwards, then all backwards; each phase is a flow shop of
  m identical jobs, whose makespan is exactly sum_s p_s + (m-1) max_s p_s:
  T = sum_s (f_s+sf_s) + (m-1) max_s (f_s+sf_s) + sum_s (b_s+sb_s) + (m-1) max_s (b_s+sb_s).
  Exact for any unequal stages under blocking sends (checked against the simulator).
- Interleaved 1F1B with v model chunks per stage (Narayanan et al. SC21 §2.2.2): the fill
  shrinks by v, each micro-batch crosses every boundary v times:
  c_s = f_s + b_s + v (sf_s + sb_s),  F = sum_s c_s,  T = m max_s c_s + (F - max_s c_s) / v.
  Equal stages: (m + (p-1)/v)(f+b), the paper's bubble (p-1)/(v m).  v = 1 gives 1F1B.
  (The last stage's sf_s is its send to stage 0 for the next chunk.)  Exact for equal stages
  without sends; with sends an upper bound (it counts v sends per boundary in the fill).

- ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism" §3.1; planner.simulate.actions.zb_h1):
  1F1B with each backward split into I (input gradient, b_s - w_s) and W (weight gradient,
  w_s = ``backward_weight_s``), rank s deferring s of its W's into the cool-down.  Two things
  leave 1F1B's fill/drain: (a) the drain carries only I's back to stage 0, so every
  non-bottleneck stage's W leaves it; (b) the first q = min(m, p) - 1 deferred W's fill a gap
  of each stage's cool-down, each shrinking it by the smallest work item, mu = min over stages
  of min(f_s, b_s - w_s, w_s) (a W fills the gap only as far as the F or I it waits beside):
  T = max(max_k [m c_k + sum_{s != k} (c_s - w_s)] - q mu,  sum_s (c_s - w_s) + w_0),
  c_s = f_s + b_s + sf_s + sb_s as in 1F1B; the second term is one micro-batch's own path
  (forwards down, input gradients back, stage 0's W last), which binds for small m.  Taken
  at its least over paddings of the F's and I's up to the least W (a run may idle a fast
  stage to a slower pace), so that no F, I or send made smaller raises it: read as is, a
  smaller F lowered mu and raised T, and the largest cycle's stage alone paying its W
  dropped T as a stage of less W overtook it (a review; ``_zb_h1_padded_s``).
  Equal stages without sends: T = m (F + I + W) + (p - 1)(F + I) - (min(m, p) - 1) min(F, I, W),
  which for m >= p and W <= F, I is the paper's m (F + I + W) + (p - 1)(F + I - W) (p=4, m=8,
  unit times: 27 against 1F1B's 33).  Exact (equal to the action-list executor,
  planner.simulate.actions) for equal stages without sends, every m and p, and for p = 1;
  with w_s = 0 it is 1F1B's formula; never above 1F1B's.  On unequal stages or with sends it
  is an estimate, not a bound: in randomised tests (tests/test_cost_schedule_sim.py)
  near-balanced stages (+-20%, W 35-55% of the backward, small sends) came out within 2% below
  to 15% above the executor (three seeds of 600); arbitrary stages (times 0.05-2 apart, extremes included) 43%
  below to 93% above (an early bottleneck's warm-up overlap, as for 1F1B; a stage 0 whose W
  dominates, which the executor cannot hide and the formula drops).

- ZB-V and DualPipeV (``schedule: zb-v`` / ``dualpipev``, two chunks per rank in a V;
  planner.cost.v_schedules): no closed form for unequal stages; the time is the action-list
  executor's makespan on the stages' chunk times (planner.simulate.zero_bubble.v_stage_times),
  exact for the executor's model by construction.  At unit chunk times it is ZB-V's
  6m + max(p - 1, 4p - 2m - 2) and DualPipeV's 6m + p - 1 (tests/test_simulate_zero_bubble.py).
  A micro-batch crosses every boundary twice each way, so the breakdown's pipeline sends are
  2 m (sf + sb) on the bottleneck, as interleaving with v = 2.

Attribution along the critical path (``pipeline_breakdown``): the bottleneck stage s* (the
largest cycle) is busy m cycles; its compute, recompute, TP comm and sends times m are the
``compute``, ``recompute``, ``tp_comm`` and ``pp_comm`` terms, and everything else of the
pipeline time is ``bubble`` (T - m c_s*, never negative).  ``iteration_time`` adds the
largest exposed DP sync and the largest optimizer step over stages (they run after the
pipeline drains; stages proceed in parallel, so the slowest one counts).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.v_schedules import V_SCHEDULES, v_schedule_time_s


@dataclass(frozen=True)
class StageTiming:
    """One stage, one micro-batch, its slowest replica; plus its per-iteration sync and step."""

    forward_s: float
    backward_s: float
    send_forward_s: float = 0.0
    send_backward_s: float = 0.0
    dp_sync_s: float = 0.0
    dp_sync_exposed_s: float = 0.0
    optimizer_s: float = 0.0
    # parts of forward_s + backward_s, for the breakdown
    compute_s: float = 0.0
    recompute_s: float = 0.0
    tp_comm_s: float = 0.0
    slowest_replica: int = 0
    # the weight-gradient part of backward_s (the W of zero-bubble schedules; the rest is I)
    backward_weight_s: float = 0.0
    # bitpipe: all-reduce of this stage's share of gradients with its pair (planner.cost.bitpipe)
    pair_sync_s: float = 0.0
    # context parallelism: the exposed K/V ring sends inside forward_s + backward_s
    cp_comm_s: float = 0.0
    # MoE expert parallelism: the token all-to-alls inside forward_s + backward_s (cost/moe.py)
    ep_comm_s: float = 0.0
    # HSDP: the part of dp_sync_s that all-reduces the gradient shard across the shard groups
    dp_replicate_s: float = 0.0

    @property
    def busy_s(self) -> float:
        return self.forward_s + self.backward_s

    def cycle_s(self, virtual_stages: int = 1) -> float:
        return self.busy_s + virtual_stages * (self.send_forward_s + self.send_backward_s)


def pipeline_time_s(stages: list[StageTiming], num_micro_batches: int, schedule: str = "1f1b",
                    virtual_stages: int = 1) -> float:
    """Time from the first forward to the last backward (no DP sync, no optimizer)."""
    m = num_micro_batches
    if not stages:
        return 0.0
    if schedule == "gpipe":
        fwd = [s.forward_s + s.send_forward_s for s in stages]
        bwd = [s.backward_s + s.send_backward_s for s in stages]
        return sum(fwd) + (m - 1) * max(fwd) + sum(bwd) + (m - 1) * max(bwd)
    if schedule == "zb-h1":
        return _zb_h1_time_s(stages, m)
    if schedule in V_SCHEDULES:
        return v_schedule_time_s(stages, m, schedule)
    if schedule == "bitpipe":  # no closed form: the action-list executor (planner.cost.bitpipe)
        from planner.cost import bitpipe

        return bitpipe.pipeline_time_s(stages, m)
    if schedule == "latency-aware":
        # no closed form: the plan's own action lists are the price (planner.cost.latency_aware)
        raise ValueError("the latency-aware schedule is priced from its action lists "
                         "(planner.cost.latency_aware.price_actions), not a closed form")
    v = virtual_stages if schedule == "interleaved-1f1b" else 1
    cycles = [s.cycle_s(v) for s in stages]
    worst = max(cycles)
    return m * worst + (sum(cycles) - worst) / v


def _zb_h1_time_s(stages: list[StageTiming], m: int) -> float:
    """ZB-H1's closed form (module docstring): max(max_k [m c_k + sum_{s != k} (c_s - w_s)]
    - q mu, sum_s (c_s - w_s) + w_0), at its least over paddings of the F's and I's
    (``_zb_h1_padded_s``)."""
    weights = [min(max(s.backward_weight_s, 0.0), s.backward_s) for s in stages]
    return _zb_h1_padded_s(stages, weights, m, max(0, min(m, len(stages)) - 1))


def _zb_h1_padded_s(stages: list[StageTiming], weights: list[float], m: int, q: int) -> float:
    """The closed form at its least over paddings: every F and I below a level lam raised to
    lam, for lam from mu (no padding) up to the least W.  mu, the least work item, is what the
    deferred W's fill; with it alone a stage made faster (a smaller F or I) lowered mu and
    raised the time (a review: 26.0 -> 26.8 as one F fell from 1 to 0.2), where a real run
    can always idle to the slower stage's pace.  Padding only F's and I's, never a W, keeps the
    search's ZB-H1 rows (planner.search.schedules, docs/search-space.md "ZB-H1's bound") below
    every padded value, since those rows never decrease as an F or I grows.  The time is
    convex in lam (each padded cycle is, and so their largest and their sum), so its least is
    found exactly enough by the item values as a grid and a k-section search between the best
    one's neighbours."""
    import numpy as np

    f = np.array([s.forward_s for s in stages], dtype=float)
    w = np.array(weights, dtype=float)
    i = np.array([s.backward_s for s in stages], dtype=float) - w
    cycles = np.array([s.cycle_s() for s in stages], dtype=float)
    items = np.concatenate([f, i])
    mu, w_min = min(float(items.min()), float(w.min())), float(w.min())

    def time_at(levels: np.ndarray) -> np.ndarray:
        c = cycles + np.maximum(levels[:, None] - f, 0.0) + np.maximum(levels[:, None] - i, 0.0)
        less_w = (c - w).sum(axis=1)
        # m c_k + sum_{s != k} (c_s - w_s) = (m - 1) c_k + w_k + sum_s (c_s - w_s), largest over
        # k (the stage of the largest cycle, taken alone, jumped down as a stage of less W
        # overtook it); at a level lam the least work item is lam itself (every F and I at
        # least lam, every W at least w_min >= lam); one micro-batch's own path binds for small m
        busiest = ((m - 1) * c + w).max(axis=1)
        return np.maximum(busiest + less_w - q * levels, less_w + w[0])

    grid = np.unique(np.concatenate([[mu, w_min], items[(items > mu) & (items < w_min)]]))
    times = time_at(grid)
    g = int(np.argmin(times))
    best = float(times[g])
    lo, hi = grid[max(g - 1, 0)], grid[min(g + 1, len(grid) - 1)]
    # k-section: the least of SECTION_POINTS inside the bracket, whose neighbours bracket the
    # least of a convex function; each step keeps 2 / (points + 1) of it
    for _ in range(SECTION_STEPS if hi > lo else 0):
        xs = np.linspace(lo, hi, SECTION_POINTS + 2)
        ts = time_at(xs)
        j = int(np.argmin(ts))
        best = min(best, float(ts[j]))
        lo, hi = xs[max(j - 1, 0)], xs[min(j + 1, len(xs) - 1)]
    return best


SECTION_POINTS, SECTION_STEPS = 32, 9    # (2/33)^9 ~ 1e-11 of the bracketing interval


def _chunks(schedule: str, virtual_stages: int) -> int:
    """How often a micro-batch crosses each boundary each way: v interleaved, 2 in a V."""
    if schedule == "interleaved-1f1b":
        return virtual_stages
    return 2 if schedule in V_SCHEDULES else 1


def bottleneck_stage(stages: list[StageTiming], schedule: str = "1f1b", virtual_stages: int = 1) -> int:
    v = _chunks(schedule, virtual_stages)
    cycles = [s.cycle_s(v) for s in stages]
    if schedule == "bitpipe":  # a rank runs half the micro-batches on its share, half on its pair's
        cycles = [(c + cycles[-1 - i]) / 2 for i, c in enumerate(cycles)]
    return max(range(len(stages)), key=lambda i: (cycles[i], -i))


def iteration_time_s(stages: list[StageTiming], num_micro_batches: int, schedule: str = "1f1b",
                     virtual_stages: int = 1) -> float:
    """pipeline + max exposed DP sync + max optimizer step (the decomposition the search uses)."""
    return (pipeline_time_s(stages, num_micro_batches, schedule, virtual_stages)
            + max((s.dp_sync_exposed_s for s in stages), default=0.0)
            + max((s.optimizer_s for s in stages), default=0.0))


BREAKDOWN_KEYS = ("compute", "recompute", "tp_comm", "pp_comm", "bubble", "dp_sync_exposed", "optimizer")
# Terms only some plans have, in the order they are listed with the seven: "cp_comm" only with
# context parallelism, "ep_comm" only with expert parallelism, so that every other plan's
# breakdown keeps its seven keys.
ALL_BREAKDOWN_KEYS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "bubble",
                      "dp_sync_exposed", "optimizer")


def breakdown_keys(breakdown: dict) -> tuple[str, ...]:
    """The terms ``breakdown`` has, in their order."""
    return tuple(k for k in ALL_BREAKDOWN_KEYS if k in breakdown)


def with_cp_comm(breakdown: dict[str, float], stages: list[StageTiming], num_micro_batches: int,
                 bottleneck: int) -> dict[str, float]:
    """The breakdown with the context-parallel ring's exposed sends named (``cp_comm``): m times
    the bottleneck stage's, taken out of the bubble, where the seven terms leave them (they
    are part of the stage's forward and backward but of none of its compute terms)."""
    cp = num_micro_batches * stages[bottleneck].cp_comm_s
    out = dict(breakdown, cp_comm=cp, bubble=max(0.0, breakdown["bubble"] - cp))
    return {key: out[key] for key in breakdown_keys(out)}


def pipeline_breakdown(stages: list[StageTiming], num_micro_batches: int, schedule: str = "1f1b",
                       virtual_stages: int = 1) -> dict[str, float]:
    """The seven named terms; they sum to ``iteration_time_s`` (see the module docstring)."""
    m = num_micro_batches
    v = _chunks(schedule, virtual_stages)
    total = pipeline_time_s(stages, m, schedule, virtual_stages)
    k = bottleneck_stage(stages, schedule, virtual_stages)
    s = stages[k]
    pair = stages[-1 - k] if schedule == "bitpipe" else s

    def per_micro_batch(name: str) -> float:  # bitpipe: half the micro-batches on each share
        return (getattr(s, name) + getattr(pair, name)) / 2

    out = {
        "compute": m * per_micro_batch("compute_s"),
        "recompute": m * per_micro_batch("recompute_s"),
        "tp_comm": m * per_micro_batch("tp_comm_s"),
        "pp_comm": m * v * (s.send_forward_s + s.send_backward_s),
    }
    if any(st.ep_comm_s for st in stages):
        out["ep_comm"] = m * per_micro_batch("ep_comm_s")
    if schedule == "bitpipe":  # each micro-batch crosses the rank's links twice (the V)
        out["pp_comm"] *= 2
    out["bubble"] = max(0.0, total - sum(out.values()))
    out["dp_sync_exposed"] = max((st.dp_sync_exposed_s for st in stages), default=0.0)
    out["optimizer"] = max((st.optimizer_s for st in stages), default=0.0)
    return {key: out[key] for key in breakdown_keys(out)}
