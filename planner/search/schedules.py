"""The schedules the search can price: one registry entry each (docs/search-space.md, "Schedules").

An entry says how a knob tuple of its schedule becomes core rows and terms
(``planner.search.core``), and whether those rows *are* the cost model's closed form
(``exact``) or only a lower bound on it.  For a bound, ``exact_time_s`` prices a core
assignment with the cost model's own formula (``planner.cost.schedule``), so every incumbent
the search keeps carries its true time and the reported gap (true value against the least
bound) stays honest; the rows only rank and prune.  The rest of an entry: its virtual stages
(interleaving: the block unit, each stage's blocks split into v chunks), whether its sends
wrap from the last stage to the first, whether its rows read forward and backward apart
(mixed stages' stand-ins then take the least line quantity by quantity, mixed.py), the
launchers that can run it, and which (p, m, L) it admits.  Its in-flight micro-batches (the
memory rule) are ``planner.cost.in_flight_micro_batches`` under its name.

Quantities per stage (slots.Quantity): forward, backward, sync less backward, optimizer,
gather less forward, backward input (the I of zero-bubble schedules, backward less W).

The V schedules (zb-v, dualpipev; v_rows.py) are priced by the action-list executor: rows
that bound its makespan, ``exact=False``, ``exact_time_s`` runs the executor.  Their head
sits on rank 0 (``head_on_first``, as ``planner.cost.evaluate`` prices a V): ``stage_ends``
says which stage carries the embedding and the head, ``role_positions`` what the knob
bounds' per-position intercepts (middle, first, last, only) then are.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from planner.cost.schedule import StageTiming, pipeline_time_s
from planner.search.core import Row, Term
from planner.search.slots import Position, Quantity, per_quantity
from planner.search.v_rows import v_iteration_s, v_rows

F, B = per_quantity(forward=1), per_quantity(backward=1)
CYCLE = per_quantity(forward=1, backward=1)
CYCLE_LESS_W = per_quantity(forward=1, backward_input=1)       # f + i = f + b - w
# the exposed DP sync: each of its two parts counts only where it exceeds what hides it
DPX = Row(stage=per_quantity(), hinges=(per_quantity(sync_less_backward=1), per_quantity(gather_less_forward=1)))
OPT = Row(stage=per_quantity(optimizer=1))
LAUNCHERS = ("megatron", "deepspeed")
# the grid a coarse knob row's p-dependent weight is rounded up to (SearchSchedule.coarse_rows)
KNOB_WEIGHT_STEP = 1.0 / 16


@dataclass(frozen=True)
class SearchSchedule:
    name: str
    rows: Callable[[int, int, int], tuple[list[Row], list[Term]]]   # (p, m, v) -> rows, terms
    exact: bool                  # rows == the cost model's closed form (else a lower bound)
    virtual_stages: int = 1
    wraps: bool = False          # a send from the last stage back to the first (p > 1)
    reads_apart: bool = False    # rows read forward / backward / input apart, not only f + b
    reads_input: bool = False    # rows read the backward's input part (zero-bubble): the bound prices W apart
    launchers: tuple[str, ...] = LAUNCHERS
    min_stages: int = 1
    divides_m: bool = False      # p must divide m (Megatron's interleaving assert)
    min_m_per_stage: int = 0     # m >= this x p (torch's ScheduleDualPipeV: m >= 2p)
    head_on_first: bool = False  # a V: rank 0 holds the embedding and the head, the last rank neither
    # rows for the knob bounds (bound.py, packed.py) where ``rows`` hold a term they do not
    # read (a min term): every plan's value on them is at most its value on ``rows``;
    # (p, m, v, stand_ins) -> rows, terms, ``stand_ins``: the options include mixed stages'
    # stand-ins, whose lines are only each quantity's least (then every coefficient >= 0)
    knob_rows: Callable[..., tuple[list[Row], list[Term]]] | None = None
    # whether ``knob_rows`` takes ``coarse``: rows at most its own that many p share (a
    # weight that changes with p rounded to KNOB_WEIGHT_STEP), for a first, cheaper try
    coarse_rows: bool = False

    def bound_rows(self, p: int, m: int, v: int, stand_ins: bool = False,
                   coarse: bool = False) -> tuple[list[Row], list[Term]]:
        """The rows the knob bounds read: ``knob_rows``, else the core's own; ``coarse``: rows
        at most those that tuples of many p share (only where ``coarse_rows``)."""
        if coarse and self.coarse_rows:
            return self.knob_rows(p, m, v, stand_ins, coarse=True)
        return self.knob_rows(p, m, v, stand_ins) if self.knob_rows else self.rows(p, m, v)

    def block_unit(self) -> int:
        return self.virtual_stages

    def admits(self, p: int, m: int, num_layers: int) -> bool:
        v = self.virtual_stages
        if p < self.min_stages or (self.divides_m and m % p) or m < self.min_m_per_stage * p:
            return False
        return v == 1 or (num_layers % v == 0 and num_layers // v >= p)

    def rule(self) -> str:
        """What ``admits`` asks, in words (for the reason no tuple exists, diagnose.py); empty
        when it admits every (p, m, L) with p >= 1."""
        parts = []
        if self.min_stages > 1:
            parts.append(f"at least {self.min_stages} stages")
        if self.divides_m:
            parts.append("a micro-batch count that is a multiple of the stage count")
        if self.min_m_per_stage:
            parts.append(f"at least {self.min_m_per_stage} micro-batches per stage")
        if self.virtual_stages > 1:
            parts.append(f"a layer count that is a multiple of {self.virtual_stages}, at least "
                         f"{self.virtual_stages} layers per stage ({self.virtual_stages} chunks a stage)")
        return f"{self.name} needs " + ", ".join(parts) if parts else ""

    def stage_ends(self, p: int, s: int) -> tuple[bool, bool]:
        """(embedding, head) of stage ``s`` of ``p`` as the cost model prices it."""
        if p == 1:
            return True, True
        if self.head_on_first:
            return s == 0, s == 0
        return s == 0, s == p - 1

    def role_positions(self) -> tuple[Position, Position, Position, Position]:
        """Per stage role (a Position): the position whose (embedding, head) it holds."""
        if self.head_on_first:
            return Position.MIDDLE, Position.ONLY, Position.MIDDLE, Position.ONLY
        return tuple(Position)

    def exact_time_s(self, prob, assign, m: int, rows_value: float) -> float:
        """The cost model's iteration time of ``assign`` on the CoreProblem ``prob``
        (``rows_value``, the rows' objective, when they are exact)."""
        if self.exact:
            return rows_value
        if self.head_on_first:
            return v_iteration_s(self.name, stage_timings(prob, assign), m)
        return _closed_form_time_s(self.name, prob, assign, m)


def _gpipe(p: int, m: int, v: int):
    rows = [Row(stage=F, out=(1,)), Row(stage=B, inn=(1,)), DPX, OPT]
    return rows, [Term("max", 0, m - 1), Term("sum", 0), Term("max", 1, m - 1), Term("sum", 1),
                  Term("max", 2), Term("max", 3)]


def _one_f_one_b(p: int, m: int, v: int):
    rows = [Row(stage=CYCLE, out=(1,), inn=(1,)), DPX, OPT]
    return rows, [Term("max", 0, m - 1), Term("sum", 0), Term("max", 1), Term("max", 2)]


def _interleaved(p: int, m: int, v: int):
    rows = [Row(stage=CYCLE, out=(v,), inn=(v,)), DPX, OPT]
    return rows, [Term("max", 0, m - 1.0 / v), Term("sum", 0, 1.0 / v), Term("max", 1), Term("max", 2)]


W = per_quantity(backward=1, backward_input=-1)     # w = b - i, the weight-gradient part of the backward


def zb_h1_mu_weight(p: int, m: int) -> int:
    """q - 1 of ZB-H1's bound (docs/search-space.md, "ZB-H1's bound"), q = min(m, p) - 1: the
    least stage's W counts q - 1 times against the 1F1B-like rows (0 for q <= 1)."""
    return max(0, min(m, p) - 2)


def _zb_h1(p: int, m: int, v: int):
    """T >= (m - 1) max_s c_s + sum_s (c_s - w_s) - (q - 1) min_s w_s (core rows: a min term)."""
    if p == 1:      # one stage: ZB-H1 is 1F1B, m c (planner.cost.schedule), exactly these rows
        return _one_f_one_b(p, m, v)
    rows = [Row(stage=CYCLE, out=(1,), inn=(1,)), Row(stage=CYCLE_LESS_W, out=(1,), inn=(1,)), DPX, OPT,
            Row(stage=W)]
    terms = [Term("max", 0, m - 1), Term("sum", 1), Term("max", 2), Term("max", 3)]
    k = zb_h1_mu_weight(p, m)
    return rows, terms + ([Term("min", 4, -float(k))] if k else [])


def zb_h1_beta(p: int, m: int) -> float:
    """beta of the knob bounds' ZB-H1 rows: (q - 1) / (m - 1), 0 for m = 1."""
    return zb_h1_mu_weight(p, m) / (m - 1) if m > 1 else 0.0


def _coarse(weight: float) -> float:
    """``weight`` rounded up to a multiple of KNOB_WEIGHT_STEP (at most 1)."""
    return min(1.0, math.ceil(weight / KNOB_WEIGHT_STEP - 1e-9) * KNOB_WEIGHT_STEP)


def _zb_h1_knob(p: int, m: int, v: int, stand_ins: bool = False, coarse: bool = False):
    """The knob bounds' rows, at most the core rows on every plan, without the min term:
    1F1B's max row and ``sum_s (c_s - w_s - k/p w_s)``, k = q - 1 (the least W is at most the
    mean W), so the bottleneck's bounds are 1F1B's; with mixed stages' stand-ins (whose
    lines are each quantity's least, so a negative coefficient, here on b, would not stay
    below the stage) ``(m - 1) max_s (c_s - beta w_s) + sum_s (c_s - w_s)`` instead (the
    least W is at most the W of the stage where c - beta w is largest), every coefficient
    on f, b, i and the sends >= 0.  ``coarse``: k/p or beta rounded up (``_coarse``): a
    larger weight on W >= 0 only lowers the rows, and tuples of many p then share them (the
    knob bound's per-row pieces are the memory-aware level's main cost; bound.py)."""
    if p == 1:
        return _one_f_one_b(p, m, v)
    if stand_ins:
        beta = zb_h1_beta(p, m)
        beta = _coarse(beta) if coarse else beta
        top = per_quantity(forward=1, backward=1 - beta, backward_input=beta)      # f + b - beta (b - i)
        rows = [Row(stage=top, out=(1,), inn=(1,)), Row(stage=CYCLE_LESS_W, out=(1,), inn=(1,)), DPX, OPT]
    else:
        kappa = zb_h1_mu_weight(p, m) / p
        kappa = _coarse(kappa) if coarse else kappa
        fill = per_quantity(forward=1, backward=-kappa, backward_input=1 + kappa)   # f + i - kappa (b - i)
        rows = [Row(stage=CYCLE, out=(1,), inn=(1,)), Row(stage=fill, out=(1,), inn=(1,)), DPX, OPT]
    return rows, [Term("max", 0, m - 1), Term("sum", 1), Term("max", 2), Term("max", 3)]


SCHEDULES: dict[str, SearchSchedule] = {
    "gpipe": SearchSchedule("gpipe", _gpipe, exact=True, reads_apart=True),
    "1f1b": SearchSchedule("1f1b", _one_f_one_b, exact=True),
    # DeepSpeed's engine runs one stage per rank (planner launch --format deepspeed refuses it)
    "interleaved-1f1b": SearchSchedule("interleaved-1f1b", _interleaved, exact=True, virtual_stages=2,
                                       wraps=True, min_stages=2, divides_m=True, launchers=("megatron",)),
    # Megatron-LM and DeepSpeed have no zero-bubble schedule (planner launch refuses it)
    "zb-h1": SearchSchedule("zb-h1", _zb_h1, exact=False, reads_apart=True, reads_input=True, launchers=(),
                            knob_rows=_zb_h1_knob, coarse_rows=True),
    # two chunks per rank in a V (even blocks per stage), the head on rank 0; torch's
    # ScheduleZBVZeroBubble / ScheduleDualPipeV, neither in Megatron-LM nor DeepSpeed
    "zb-v": SearchSchedule("zb-v", v_rows, exact=False, virtual_stages=2, reads_apart=True, reads_input=True, launchers=(),
                           min_stages=2, head_on_first=True),
    "dualpipev": SearchSchedule("dualpipev", v_rows, exact=False, virtual_stages=2, reads_apart=True, reads_input=True,
                                launchers=(), min_stages=2, min_m_per_stage=2, head_on_first=True),
}


def schedule_of(name: str) -> SearchSchedule:
    return SCHEDULES[name]


def schedules_for(training, launcher: str | None = None) -> list[SearchSchedule]:
    """``training.schedules`` as registry entries, less those ``launcher`` cannot run."""
    missing = [s for s in training.schedules if s not in SCHEDULES]
    if missing:
        from planner.errors import InputError
        raise InputError(f"training.schedules: the search cannot price {', '.join(missing)} yet; "
                         f"searchable: {', '.join(SCHEDULES)}")
    out = [SCHEDULES[s] for s in training.schedules]
    return [s for s in out if launcher is None or launcher in s.launchers]


def _closed_form_time_s(name: str, prob, assign, m: int) -> float:
    """planner.cost.schedule's iteration time for ``assign``: StageTimings from the core
    quantities (forward, backward, W = backward - input) and the boundary sends (stage s sends
    forward on boundary s and backward on boundary s - 1, as evaluate sets them), plus the
    largest exposed DP sync and optimizer step (the rows DPX and OPT)."""
    stages = stage_timings(prob, assign)
    return (pipeline_time_s(stages, m, name) + max(st.dp_sync_exposed_s for st in stages)
            + max(st.optimizer_s for st in stages))


def stage_timings(prob, assign) -> list[StageTiming]:
    """Per stage of ``assign`` on ``prob``, the cost model's StageTiming from the core
    quantities: forward, backward, W = backward - input, the boundary sends (stage s sends
    forward on boundary s and backward on boundary s - 1, as evaluate sets them), the exposed
    DP sync (row DPX, floored at 0 as the max term is) and the optimizer step (row OPT)."""
    p = prob.num_stages
    quantities = [[o.slope[k] * nb + o.fixed[s][k] for k in range(len(o.slope))]
                  for s, (o, nb) in enumerate((prob.options[i], nb) for i, nb in assign)]
    sends = [0.0] * max(0, p - 1)
    if prob.boundary is not None:
        sends = [float(prob.boundary[0, assign[b][0], assign[b + 1][0]]) for b in range(p - 1)]
    vals = prob.stage_values(assign)
    dpx = next((vals[j] for j, r in enumerate(prob.rows) if r == DPX), [0.0] * p)
    opt = next((vals[j] for j, r in enumerate(prob.rows) if r == OPT), [0.0] * p)
    fwd, bwd, inp = Quantity.FORWARD, Quantity.BACKWARD, Quantity.BACKWARD_INPUT
    return [StageTiming(forward_s=q[fwd], backward_s=q[bwd], backward_weight_s=q[bwd] - q[inp],
                        send_forward_s=sends[s] if s < p - 1 else 0.0,
                        send_backward_s=sends[s - 1] if s > 0 else 0.0,
                        dp_sync_exposed_s=max(0.0, float(dpx[s])), optimizer_s=max(0.0, float(opt[s])),
                        compute_s=q[fwd] + q[bwd])
            for s, q in enumerate(quantities)]
