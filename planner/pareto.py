"""The plans on the front of USD/hour against tokens/s (``planner pareto``).

The search optimises one objective at a time, so the front is swept: the fastest plan
(``throughput``) and the cheapest per token (``cost``) bound it, and between them
``cost-above-floor`` searches at evenly spaced tokens/s floors give the least USD/hour that
reaches each floor.  (Plans slower than the cheapest per token, cheaper per hour but dearer per
token, are left out.)  The plans found are kept when no other is at least as fast and at most as
dear.  Each point is as good as its own search proved it (its status and gap): under a short
time limit a point may sit above the true front.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner.errors import InfeasibleError, InputError
from planner.output_files import file_suffix, save_figure

MIN_FLOORS = 0
MAX_FLOORS = 32


@dataclass(frozen=True)
class FrontPoint:
    tokens_per_s: float
    usd_per_hour: float
    objective: str          # the search that found it
    status: str
    gap: float | None
    plan: object            # planner.plan.Plan

    def to_json(self) -> dict:
        return {"tokens_per_s": self.tokens_per_s, "usd_per_hour": self.usd_per_hour,
                "usd_per_million_tokens": self.usd_per_hour / 3600 / self.tokens_per_s * 1e6,
                "objective": self.objective, "status": self.status, "gap": self.gap,
                "plan": self.plan.to_json()}


def _point(result, objective: str, cluster) -> FrontPoint:
    ev, rep = result.evaluation, result.report
    if ev.usd_per_hour is None:     # name the spec's unpriced groups, as the cost search does
        used = {r.gpu_type for s in result.plan.stages for r in s.replicas}
        raise cluster.missing_prices("the Pareto front", used)
    return FrontPoint(ev.tokens_per_s, ev.usd_per_hour, objective, rep.status, rep.gap, result.plan)


def non_dominated(points: list[FrontPoint]) -> list[FrontPoint]:
    """The points no other is at least as fast and at most as dear as (strictly better in one),
    by tokens/s ascending; of equal points the first found stays."""
    front = []
    for p in points:
        dominated = any((q.tokens_per_s >= p.tokens_per_s and q.usd_per_hour <= p.usd_per_hour)
                        and (q.tokens_per_s > p.tokens_per_s or q.usd_per_hour < p.usd_per_hour)
                        for q in points)
        same = any((q.tokens_per_s, q.usd_per_hour) == (p.tokens_per_s, p.usd_per_hour) for q in front)
        if not dominated and not same:
            front.append(p)
    return sorted(front, key=lambda p: p.tokens_per_s)


def pareto(cluster, model, training, floors: int = 4, time_limit_s: float = 60.0, **options) -> list[FrontPoint]:
    """The front, from ``floors + 2`` searches sharing ``time_limit_s`` evenly."""
    from planner import api

    if not MIN_FLOORS <= floors <= MAX_FLOORS:
        raise InputError(f"--floors must be between {MIN_FLOORS} and {MAX_FLOORS}, got {floors}")
    each_s = time_limit_s / (floors + 2)
    fast = _point(api.plan(cluster, model, training, objective="throughput", time_limit_s=each_s, **options),
                  "throughput", cluster)
    cheap = _point(api.plan(cluster, model, training, objective="cost", time_limit_s=each_s, **options), "cost",
                   cluster)
    points = [cheap, fast]
    low, high = min(cheap.tokens_per_s, fast.tokens_per_s), fast.tokens_per_s
    for k in range(1, floors + 1):
        floor = low + (high - low) * k / (floors + 1)
        try:
            result = api.plan(cluster, model, training, objective="cost-above-floor", time_limit_s=each_s,
                              min_tokens_per_s=floor, **options)
        except InfeasibleError:
            continue        # this search found no plan reaching the floor in its time
        points.append(_point(result, f"cost-above-floor {floor:,.0f} tokens/s", cluster))
    return non_dominated(points)


def check_plot_path(path) -> Path:
    """Before the searches, not after them: the picture's format comes from its suffix."""
    path = Path(path)
    if file_suffix(path) not in (".png", ".svg"):
        raise InputError(f"--plot {path}: the file must end in .png or .svg")
    return path


def plot_front(points: list[FrontPoint], path, title: str) -> None:
    """USD/hour against tokens/s, one marker per plan, to ``path`` (.png or .svg)."""

    path = check_plot_path(path)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install matplotlib") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs, ys = [p.tokens_per_s for p in points], [p.usd_per_hour for p in points]
    # the least USD/hour that reaches a tokens/s between two plans is the faster one's: steps
    ax.plot(xs, ys, "o", color="tab:blue")
    ax.plot(xs, ys, drawstyle="steps-pre", color="tab:blue", alpha=0.5)
    for p in points:
        ax.annotate(p.status if p.status != "optimal" else "", (p.tokens_per_s, p.usd_per_hour),
                    textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("tokens/s")
    ax.set_ylabel("USD/hour")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    try:
        save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)
