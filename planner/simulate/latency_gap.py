"""Greedy against exact on one latency problem: how far the list-scheduling rule is from the
proved optimum (issue 17: "the gap between them reported")."""

from __future__ import annotations

from dataclasses import dataclass

from planner.simulate.latency import LatencyProblem
from planner.simulate.latency_greedy import greedy
from planner.simulate.latency_milp import ExactResult, exact


@dataclass
class Gap:
    greedy_s: float
    exact: ExactResult

    @property
    def bound_s(self) -> float:
        return self.exact.bound_s

    @property
    def gap(self) -> float:
        """(greedy - proved bound) / proved bound: the most the greedy can be above optimal
        (exactly that when the MILP proved optimality)."""
        return (self.greedy_s - self.bound_s) / self.bound_s if self.bound_s > 0 else 0.0

    def to_json(self) -> dict:
        e = self.exact
        return {"greedy_s": self.greedy_s, "exact_s": e.makespan_s, "bound_s": e.bound_s,
                "status": e.status, "gap": self.gap, "solver_wall_s": e.wall_s}


def greedy_gap(problem: LatencyProblem, time_limit_s: float = 30.0) -> Gap:
    g = greedy(problem)
    return Gap(g.makespan_s, exact(problem, g.makespan_s, time_limit_s))
