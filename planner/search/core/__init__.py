"""The solver core on plain arrays: no cluster, model or plan objects in here.

The search (``planner.search``) prices stage options with the cost model and hands this core
a :class:`CoreProblem`; the core picks one option and a block count per stage.  Three exact
solvers live here and are cross-checked by the tests: a DP over contiguous block ranges
(``dp``), a MILP over options (``milp``) and a brute-force enumeration (``brute``).
"""

from planner.search.core.problem import CoreOption, CoreProblem, CoreSolution, Row, Term

__all__ = ["CoreOption", "CoreProblem", "CoreSolution", "Row", "Term"]
