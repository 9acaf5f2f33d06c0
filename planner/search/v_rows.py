"""The V schedules (zb-v, dualpipev) in the search: their lower-bound rows and exact pricing.

Both run two chunks per rank in a V (rank r holds global stages r and 2p-1-r), the head's
chunk on rank 0, and have no closed form for unequal stages: the cost model's time is the
action-list executor's makespan (planner.cost.v_schedules).  The search ranks and prunes with
rows that are a proved lower bound of that makespan (docs/search-space.md, "The V schedules'
bound") and prices every incumbent with the executor itself (``v_iteration_s``), the way
evaluate does, so its reported time and gap stay honest.

Per rank and micro-batch, with f, b, w the rank's whole forward, backward and W (each chunk
half of them) and sf / sb its sends to the next / previous rank:

- work floor: the rank computes f + b and blocks on 2 (sf + sb) of sends (each chunk sends
  its activation one way and its gradient the other), all in sequence, of which only the
  last action's send may end after the makespan: ``T >= m (f + b) + (2m - 1)(sf + sb)``;
- path: one micro-batch's forwards down and up the V and its input gradients back:
  ``T >= sum_r (f_r + i_r + 2 sf_r + 2 sb_r)``, i = b - w.

Rows can only add terms, so a tuple takes one of the two: the one larger at unit chunk times
(F = I = W: work 6m, path 4p), i.e. the work floor when 3m >= 2p.
"""

from __future__ import annotations

from planner.search.core import Row, Term
from planner.search.slots import per_quantity

# schedules.py's rows of the same names (it imports this module, so they cannot be shared)
_CYCLE = per_quantity(forward=1, backward=1)
_CYCLE_LESS_W = per_quantity(forward=1, backward_input=1)       # f + i
_DPX = Row(stage=per_quantity(), hinges=(per_quantity(sync_less_backward=1), per_quantity(gather_less_forward=1)))
_OPT = Row(stage=per_quantity(optimizer=1))


def uses_work_floor(p: int, m: int) -> bool:
    """Whether the rows take the work floor (else the path): the larger at unit chunk times."""
    return 3 * m >= 2 * p


def v_rows(p: int, m: int, v: int) -> tuple[list[Row], list[Term]]:
    """The rows of zb-v and dualpipev (module docstring): a lower bound of the executor's
    makespan, plus the largest exposed DP sync and optimizer step as evaluate adds them."""
    sends = 2.0 - 1.0 / m
    rows = [Row(stage=_CYCLE, out=(sends,), inn=(sends,)),
            Row(stage=_CYCLE_LESS_W, out=(2.0,), inn=(2.0,)), _DPX, _OPT]
    pipe = Term("max", 0, float(m)) if uses_work_floor(p, m) else Term("sum", 1, 1.0)
    return rows, [pipe, Term("max", 2), Term("max", 3)]


def v_iteration_s(name: str, stages, m: int) -> float:
    """evaluate's iteration time of a V plan on ``stages`` (cost StageTiming, rank 0 first,
    priced with the embedding and the head): the sum of ``pipeline_breakdown``, whose
    pipeline term is the executor's makespan (cached per timing in planner.cost.v_schedules)."""
    from planner.cost.schedule import pipeline_breakdown

    return sum(pipeline_breakdown(stages, m, name, 2).values())
