"""Pictures and traces of an action-list run (``planner.simulate.actions.Execution``).

- ``timeline_figure`` / ``write_timeline``: one row per rank (rank 0 on top), F / B / I / W
  blocks coloured and numbered by micro-batch (``mb`` or ``mb.chunk`` with several chunks per
  rank), sends as thin yellow bars under the row, BitPipe's pair all-reduces as thin red bars
  over both rows of the pair (they run beside compute and may end the iteration), idle gaps
  left blank.  matplotlib is
  imported here, lazily: only a drawing needs it (``pip install matplotlib``, in the ``dev``
  extra).
- ``chrome_trace`` / ``write_trace``: Chrome trace events (the JSON object form with
  ``traceEvents``; complete events ``ph: "X"`` with ``ts`` and ``dur`` in microseconds) that
  Perfetto (ui.perfetto.dev) and chrome://tracing open.  Process ``pid`` = rank; its compute
  is thread ``tid`` = rank, its sends thread ``num_ranks + rank`` and its pair all-reduces
  (BitPipe) thread ``2 * num_ranks + rank``, named by metadata events.
"""

from __future__ import annotations

import json
from pathlib import Path

from planner.errors import InputError
from planner.output_files import file_suffix, save_figure, write_staged
from planner.simulate.actions import Execution

COLOURS = {"F": "#4c9be8", "B": "#b065c9", "I": "#f08a3c", "W": "#5cb85c",
           "send-F": "#e8c547", "send-B": "#c9a227", "sync": "#d9534f"}
NAMES = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weights)",
         "send-F": "send activation", "send-B": "send gradient", "sync": "pair gradient all-reduce"}
TIMELINE_SUFFIXES = (".png", ".svg")
LEGEND_ONE_ROW_IN = 14.0     # figures narrower than this (inches) wrap the legend into rows of 3


def _label(run: Execution, a) -> str:
    return f"{a.micro_batch}.{a.chunk}" if run.schedule.chunks > 1 else str(a.micro_batch)


def _sync_label(sync) -> str:
    return f"all-reduce stage {sync.stage} (ranks {sync.ranks[0]}+{sync.ranks[1]})"


def _unit(span_s: float) -> tuple[str, float]:
    if span_s >= 1:
        return "s", 1.0
    if span_s >= 1e-3:
        return "ms", 1e3
    return "us", 1e6


def timeline_figure(run: Execution, title: str | None = None):
    """A matplotlib Figure of the run."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise InputError("--timeline needs matplotlib: pip install matplotlib "
                         "(or the dev extra: pip install -e '.[dev]')") from None
    p = run.schedule.num_ranks
    unit, scale = _unit(run.makespan_s)
    span = run.makespan_s * scale or 1.0
    width = min(40.0, max(8.0, 0.35 * len(run.actions) / max(p, 1)))
    fig, ax = plt.subplots(figsize=(width, 0.7 * p + 1.6))
    height, send_h = 0.62, 0.16
    for a in run.actions:
        y = p - 1 - a.rank
        x0, w = a.start_s * scale, (a.end_s - a.start_s) * scale
        alpha = 1.0 if a.chunk % 2 == 0 else 0.6
        ax.broken_barh([(x0, w)], (y - height / 2, height), facecolors=COLOURS[a.kind],
                       edgecolors="black", linewidth=0.4, alpha=alpha)
        if w > span / (width * 9):
            ax.text(x0 + w / 2, y, _label(run, a), ha="center", va="center", fontsize=7)
    for s in run.sends:
        y = p - 1 - s.rank - height / 2 - send_h - 0.02
        x0, w = s.start_s * scale, (s.end_s - s.start_s) * scale
        ax.broken_barh([(x0, w)], (y, send_h), facecolors=COLOURS[s.kind], edgecolors="black", linewidth=0.3)
        if w > span / (width * 9):
            ax.text(x0 + w / 2, y + send_h / 2, str(s.micro_batch), ha="center", va="center", fontsize=5)
    _draw_pair_syncs(ax, run, scale, span / width, height)
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"rank {p - 1 - i}" for i in range(p)])
    ax.set_ylim(-0.8, p - 0.3)
    ax.set_xlim(0, span)
    ax.set_xlabel(f"time ({unit})")
    kinds = sorted({a.kind for a in run.actions} | {s.kind for s in run.sends}
                   | ({"sync"} if run.pair_syncs else set()), key=list(COLOURS).index)
    handles = [Patch(facecolor=COLOURS[k], edgecolor="black", label=NAMES[k]) for k in kinds]
    if run.schedule.chunks > 1:
        handles.append(Patch(facecolor="white", edgecolor="black", label="label: micro-batch.chunk, "
                             "odd chunks lighter"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.35 / (0.7 * p + 1.6) * 3),
              ncol=len(handles) if width >= LEGEND_ONE_ROW_IN else min(len(handles), 3), fontsize=8, frameon=False)
    sched = run.schedule
    ax.set_title(title or (f"{sched.name}: {p} ranks, {sched.num_micro_batches} micro-batches"
                           + (f", {sched.chunks} chunks per rank" if sched.chunks > 1 else "")
                           + f"; {run.makespan_s * scale:.4g} {unit}, bubble {run.bubble_fraction:.1%}"),
                 fontsize=10)
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    fig.tight_layout()
    return fig


def _draw_pair_syncs(ax, run: Execution, scale: float, inch_span: float, height: float) -> None:
    """Each pair all-reduce as a thin bar over the compute row of both ranks of its pair,
    labelled by stage where it is wide enough (``inch_span``: the time one inch covers)."""
    sync_h = 0.13
    for sync in run.pair_syncs:
        x0, w = sync.start_s * scale, (sync.end_s - sync.start_s) * scale
        for rank in sync.ranks:
            y = run.schedule.num_ranks - 1 - rank + height / 2 + 0.02
            ax.broken_barh([(x0, w)], (y, sync_h), facecolors=COLOURS["sync"], edgecolors="black", linewidth=0.3)
            # the longest label that fits: about 14 characters of 5 pt text per inch
            fits = [t for t in (_sync_label(sync), f"stage {sync.stage}") if w > inch_span * len(t) / 14]
            if fits:
                ax.text(x0 + w / 2, y + sync_h / 2, fits[0], ha="center", va="center", fontsize=5, color="white")


def write_timeline(run: Execution, path: str | Path, title: str | None = None, keep_staged: bool = False) -> Path:
    """Draw the run to ``path`` (.png or .svg); ``keep_staged``: leave the drawing in its
    temporary file beside ``path`` and return that (output_files.write_staged)."""
    path = Path(path)
    if file_suffix(path) not in TIMELINE_SUFFIXES:
        raise InputError(f"--timeline {path}: the file must end in .png or .svg")
    fig = timeline_figure(run, title)
    import matplotlib.pyplot as plt

    try:
        return save_figure(fig, path, dpi=150, keep_staged=keep_staged)
    finally:
        plt.close(fig)


def chrome_trace(run: Execution) -> dict:
    """The run as a Chrome trace event object (times in microseconds)."""
    p = run.schedule.num_ranks
    events: list[dict] = []
    for r in range(p):
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": r, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": r, "args": {"sort_index": r}})
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": r, "args": {"name": "compute"}})
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": p + r, "args": {"name": "sends"}})
        if run.pair_syncs:
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": 2 * p + r,
                           "args": {"name": "pair all-reduce"}})
    for a in run.actions:
        events.append({"name": f"{a.kind}{_label(run, a)}", "cat": a.kind, "ph": "X", "pid": a.rank,
                       "tid": a.rank, "ts": a.start_s * 1e6, "dur": (a.end_s - a.start_s) * 1e6,
                       "args": {"stage": a.stage, "chunk": a.chunk, "micro_batch": a.micro_batch,
                                "kind": NAMES[a.kind]}})
    for s in run.sends:
        events.append({"name": f"{s.kind} {s.micro_batch}", "cat": s.kind, "ph": "X", "pid": s.rank,
                       "tid": p + s.rank, "ts": s.start_s * 1e6, "dur": (s.end_s - s.start_s) * 1e6,
                       "args": {"from_stage": s.stage, "to_stage": s.stage + (1 if s.kind == "send-F" else -1),
                                "micro_batch": s.micro_batch}})
    for sync in run.pair_syncs:
        for rank in sync.ranks:
            events.append({"name": _sync_label(sync), "cat": "sync", "ph": "X", "pid": rank, "tid": 2 * p + rank,
                           "ts": sync.start_s * 1e6, "dur": (sync.end_s - sync.start_s) * 1e6,
                           "args": {"stage": sync.stage, "ranks": list(sync.ranks), "kind": NAMES["sync"]}})
    sched = run.schedule
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": sched.name, "ranks": p, "chunks_per_rank": sched.chunks,
                          "stage_map": sched.stage_map, "micro_batches": sched.num_micro_batches,
                          "makespan_s": run.makespan_s}}


def write_trace(run: Execution, path: str | Path) -> Path:
    """Write the trace to ``path`` via a temporary file and a rename (never half-written)."""
    text = json.dumps(chrome_trace(run), sort_keys=True) + "\n"
    return write_staged(path, lambda tmp: tmp.write_text(text))
