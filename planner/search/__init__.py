"""Search (DESIGN §3, §6): the declared plan space, the exact solvers and the objectives.

``solve(cluster, model, training, objective=..., time_limit_s=..., top_k=1, launcher=None)``
returns a ``SearchResult`` (plans with ``predicted`` and ``solver`` filled, their
evaluations, the solver report).  The space is written down in docs/search-space.md.
"""

from planner.search.objectives import KINDS as OBJECTIVES
from planner.search.objectives import ObjectiveSpec, parse_objective
from planner.search.solve import SearchResult, check_time_limit, solve

__all__ = ["OBJECTIVES", "ObjectiveSpec", "SearchResult", "check_time_limit", "parse_objective", "solve"]
