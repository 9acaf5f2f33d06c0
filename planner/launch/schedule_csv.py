"""How a plan's pipeline schedule runs under torch.distributed.pipelining: a schedule class
torch ships, or the plan's per-rank action lists as a CSV for ``_PipelineScheduleRuntime``.

The CSV is the "compute_only" format torch 2.13's ``PipelineScheduleMulti._load_csv`` reads
(torch/distributed/pipelining/schedules.py): one row per pipeline rank, row ``r`` is rank ``r``'s
actions in order, one cell each, spelled ``<stage><type><micro-batch>`` (``_Action.from_str``:
regex ``(\\d+)(F|I|B|W|...)(\\d*)``), with the *global* stage index.  ``_PipelineScheduleRuntime
._load_csv`` validates it (``_validate_schedule``: every stage has n_microbatches F's, B's or
equal I / W counts, each stage on one rank, which is how it infers the stage-to-rank map) and
lowers it to the compute_comms form by adding the sends, receives and gradient reductions.

``ROUTES`` is the one registry of the choice: schedule name -> torch class, or ``None`` when
torch has no class for it and the lists go through the CSV.  ``route(plan, force_csv)`` applies
it; ``--schedule-csv`` forces the CSV for any schedule.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from planner.errors import InputError
from planner.plan import Plan
from planner.simulate.actions import Action, Schedule, ScheduleError, generate, validate

CSV_FILE = "pipeline_schedule.csv"

# schedule name -> torch.distributed.pipelining class that runs it, or None: CSV only.
# Names a plan may carry that are not listed here are refused (no class, no known lists).
ROUTES: dict[str, str | None] = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    # ZB-H1 (Qi et al. 2024) is torch's interleaved zero bubble with one stage per rank
    # (planner.simulate.actions.zb_h1 checks the orders are the same)
    "zb-h1": "ScheduleInterleavedZeroBubble",
    # two stages per rank in a V (planner.simulate.zero_bubble checks the orders); their CSV
    # route is refused (_check_csv_able: the launch layout of a V is the class's)
    "zb-v": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV",
    # CrossPipe-style lists chosen by the planner itself: torch has no class, the CSV runs them
    "latency-aware": None,
}


@dataclass(frozen=True)
class Route:
    """How one plan runs: ``class_name`` set for a stock class, else ``actions`` for the CSV."""

    class_name: str | None
    actions: Schedule | None

    @property
    def uses_csv(self) -> bool:
        return self.actions is not None


def actions_csv(schedule: Schedule) -> str:
    """``schedule`` in torch's compute_only CSV: row r = rank r, cells ``<stage><kind><mb>``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in schedule.table():
        writer.writerow(row)
    return out.getvalue()


def parse_plan_actions(plan: Plan) -> Schedule | None:
    """The plan's stored per-rank lists (optional field ``pipeline_actions``: per rank a list of
    ``"F0.3"`` strings, kind, rank-local chunk, micro-batch) as a ``Schedule`` on the loop map,
    or None when the plan stores none."""
    stored = getattr(plan, "pipeline_actions", None)
    if not stored:
        return None
    ranks = []
    for r, row in enumerate(stored):
        acts = []
        for i, text in enumerate(row):
            kind, rest = str(text)[:1], str(text)[1:]
            chunk, dot, mb = rest.partition(".")
            if not dot or not chunk.isdigit() or not mb.isdigit():
                raise InputError(f"launch: pipeline_actions[{r}][{i}] is {text!r}; an action is "
                                 "<F|B|I|W><chunk>.<micro-batch>, e.g. F0.3")
            try:
                acts.append(Action(kind, int(chunk), int(mb)))
            except ScheduleError as exc:
                raise InputError(f"launch: pipeline_actions[{r}][{i}]: {exc}") from None
        ranks.append(tuple(acts))
    try:
        sched = Schedule(plan.schedule, plan.num_stages, plan.virtual_stages, plan.num_micro_batches,
                         "loop", tuple(ranks))
        validate(sched)
    except ScheduleError as exc:
        raise InputError(f"launch: the plan's pipeline_actions do not run: {exc}") from None
    return sched


def plan_actions(plan: Plan) -> Schedule:
    """The action lists the plan runs: the stored ones, else the named generator's."""
    stored = parse_plan_actions(plan)
    if stored is not None:
        return stored
    try:
        return generate(plan.schedule, plan.num_stages, plan.num_micro_batches, plan.virtual_stages)
    except ScheduleError as exc:
        raise InputError(f"launch: schedule {plan.schedule!r} has no action lists for this plan "
                         f"({exc}); it cannot be written as a CSV") from None


def _check_csv_able(sched: Schedule, fmt: str) -> None:
    # The launch formats lay the model pieces out on the loop map (launch.common.chunks), so a
    # V-shaped list would run the wrong blocks on a rank; refused until the layout follows it.
    if sched.stage_map != "loop":
        raise InputError(f"launch --format {fmt}: schedule {sched.name} uses the {sched.stage_map!r} "
                         "stage map; the launch formats lay pieces out on the loop map only")
    # torch infers the stage-to-rank map from the CSV and needs one rank per stage; a map
    # holding a stage on two ranks (duplicated weights) cannot be written.
    stages_on: dict[int, set[int]] = {}
    for r in range(sched.num_ranks):
        for c in range(sched.chunks):
            stages_on.setdefault(sched.stage(r, c), set()).add(r)
    shared = [s for s, rs in stages_on.items() if len(rs) > 1]
    if shared:
        raise InputError(f"launch --format {fmt}: schedule {sched.name} places stage {shared[0]} on "
                         "more than one rank; torch's CSV runtime maps each stage to one rank")


def route(plan: Plan, force_csv: bool = False, fmt: str = "pipelining") -> Route:
    """Class if torch has one for the plan's schedule (and the lists were not stored or forced),
    else the CSV of its action lists; ``InputError`` when neither exists."""
    name = plan.schedule
    stored = parse_plan_actions(plan)
    if name not in ROUTES and stored is None:
        try:
            generate(name, plan.num_stages, plan.num_micro_batches, plan.virtual_stages)
        except ScheduleError:
            raise InputError(f"launch --format {fmt}: schedule {name!r} has neither a torch "
                             "schedule class nor action lists this launcher can write; "
                             f"known: {', '.join(ROUTES)}") from None
    cls = ROUTES.get(name)
    if name == "interleaved-1f1b" and plan.virtual_stages == 1:
        cls = "Schedule1F1B"  # one chunk per rank: interleaving degenerates to plain 1F1B
    if cls is not None and stored is None and not force_csv:
        return Route(cls, None)
    sched = stored if stored is not None else plan_actions(plan)
    try:
        _check_csv_able(sched, fmt)
    except InputError as exc:
        if cls is not None and stored is None:    # only the flag asked for lists: the class runs it
            raise InputError(f"{exc.message}; drop --schedule-csv to run it with torch's {cls}") from None
        raise
    return Route(None, sched)


def class_problems(plan: Plan, how: Route) -> list[str]:
    """What a stock class refuses at construction that the plan might hold (torch 2.13's
    schedules.py; the search's plans may hold 1F1B with fewer micro-batches than stages,
    which Megatron-LM and DeepSpeed run but torch's class does not)."""
    m, p = plan.num_micro_batches, plan.num_stages
    if how.class_name == "Schedule1F1B" and m < p:
        # Schedule1F1B.__init__: n_microbatches >= the number of stages
        return [(f"schedule {plan.schedule} with {m} micro-batches over {p} stages: torch's "
                 f"Schedule1F1B needs at least as many micro-batches as stages; re-plan "
                 f"num_micro_batches (at least {p}), or use --schedule-csv (the same 1F1B "
                 f"order as per-rank action lists)")]
    if how.class_name != "ScheduleInterleavedZeroBubble":
        return []
    # ScheduleInterleavedZeroBubble.__init__: rounds = max(1, n_microbatches // pp size) and
    # n_microbatches must be a multiple of the rounds.
    rounds = max(1, m // p)
    if m % rounds == 0:
        return []
    return [(f"schedule {plan.schedule} with {m} micro-batches over {p} stages: torch's "
            f"ScheduleInterleavedZeroBubble needs num_micro_batches to be a multiple of its "
            f"rounds, max(1, {m} // {p}) = {rounds}; re-plan num_micro_batches (a multiple "
            f"of {p}, or at most {p}), or use --schedule-csv")]
