"""Lower bounds on a knob tuple's objective value, for every objective, from a lower bound on
its iteration time (the knob bound, in seconds).

The throughput objectives rank and prune tuples by their time bound directly.  The cost
objectives need the price too; two facts about every plan of a tuple give it:

- **Price floor.**  A plan has p stages and each rents at least its option's price:
  ``price >= p * min_o pi_o``.  A class of one node (``shared_node``) is rented once, whatever
  its stages take; its options are charged ``node price * units / capacity``, whose sum over
  the stages on that node is at most the node's price, so the floor still holds.  A plan
  also rents at least one class: at least the least, over classes, of a one-node class's
  price or another class's cheapest option.
- **Work floor.**  Every schedule the search prices keeps each stage busy for at least m
  cycles of its forward and backward (1F1B ``F + (m-1) max c >= m c_s``, interleaved
  ``m max c + ... >= m c_s``, GPipe's two flow shops likewise; the DP sync and the optimizer
  step only add), so ``time >= m (f_s + b_s)`` for every stage s.  A stage's forward +
  backward is its option's line at its position, ``a_o nb_s + c_o(pos_s)``, and with
  ``nb_s >= 1`` it is at least ``r_o nb_s + e_o(pos_s)``: ``r_o = a_o + min(0, least
  intercept)`` per unit of blocks, ``e_o(pos) = max(0, c_o(pos))`` what the position adds
  (the embedding on the first stage, the head and loss on the last, the per-micro-batch
  overhead on every one).  So
  ``price * time >= sum_s pi_s m (r_s nb_s + e_s(pos_s)) >= m (L min_o (pi_o r_o) + E)``,
  ``E`` the least ``pi_o e_o`` of each position the tuple's p stages take (first, last and
  p - 2 middle; one stage: the only position; the V schedules' first stage holds the
  embedding and the head, their last is a middle one: ``role_positions``).  Without ``E`` a
  model whose head is a tenth of its work (OPT-350M's 50k vocabulary) left the cost search's
  bound a tenth under the plans.

- **Capacity floor** (under a cap on the time): each stage holds at most the blocks its
  option runs m times within the cap, so the plan rents enough whole options to hold all
  L (capacity.py); under a budget, the least cap whose floor fits it is a time floor.

Hence, with T the tuple's time bound:

- ``cost`` (price x time): ``max(p min pi x T, m L min (pi r))``;
- ``cost-above-floor`` (price, with time <= cap = tokens per iteration / floor): no plan if
  ``T > cap`` or no options hold the blocks within it, else ``max(p min pi,
  m L min (pi r) / cap, capacity floor)``;
- ``throughput-under-budget``: no plan if ``p min pi > budget``, else
  ``max(T, m L min (pi r) / budget, the least cap whose capacity floor fits the budget)``
  (a plan within the budget and faster than that cap would rent less than its floor).

Egress charges are outside the search's objective (docs/search-space.md), so outside these too.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from planner.search import clock
from planner.search.capacity import Capacity
from planner.search.knobs import Knobs, OptionKey
from planner.search.mixed import StandIn
from planner.search.objectives import ObjectiveSpec
from planner.search.schedules import SCHEDULES
from planner.search.slots import Position
from planner.search.space import Pricer


@dataclass(frozen=True)
class TupleFloors:
    """A knob tuple's price floor (USD/hour) and work floor (USD/hour x s per iteration);
    per class, what a plan using it rents at least and its cheapest option's rent share (for
    the floors of the plans on one set of classes, ``by_classes``)."""

    price_usd_per_hour: float
    work_usd_s_per_hour: float
    class_rent: tuple[tuple[int, float], ...] = ()
    class_least_share: tuple[tuple[int, float], ...] = ()
    num_stages: int = 1
    capacity: Capacity | None = None
    classes: tuple[int, ...] | None = None      # the plans on exactly these (on_classes); None: any

    def by_classes(self, spec: ObjectiveSpec, time_by_classes: dict, tokens_per_iteration: float) -> float:
        """A lower bound on the tuple's value from the time bounds of the plans on each set S
        of classes (``time_by_classes``: S -> bound; every plan uses exactly one S; a set
        without an entry counts with no time bound): such a plan rents each class of S at
        least once and has p stages of S's options, so its price is at least
        ``max(sum_S rent, p min_S share)``.  Where the cheap classes are slow this is what
        lifts the cost objectives' bound: tiny-mixed's V100 node is cheap but cannot reach a
        tokens/s floor that the A100 node can."""
        present = sorted(dict(self.class_rent))
        best = math.inf
        for size in range(1, min(len(present), self.num_stages) + 1):
            for subset in itertools.combinations(present, size):
                floors = self.on_classes(subset)
                best = min(best, floors.value(spec, time_by_classes.get(subset, 0.0), tokens_per_iteration,
                                              capacity=False))
        return best

    def on_classes(self, subset: tuple[int, ...]) -> TupleFloors:
        """The floors of the plans on exactly the classes ``subset``."""
        rent, share = dict(self.class_rent), dict(self.class_least_share)
        price = max(sum(rent[c] for c in subset), self.num_stages * min(share[c] for c in subset))
        return TupleFloors(max(price, self.price_usd_per_hour), self.work_usd_s_per_hour,
                           capacity=self.capacity, classes=subset)

    def value(self, spec: ObjectiveSpec, time_s: float, tokens_per_iteration: float,
              capacity: bool = True) -> float:
        """A lower bound on the tuple's objective value (``ObjectiveSpec.key``'s first entry)
        given a lower bound ``time_s`` on its iteration time; ``inf``: the tuple has no plan
        under the objective's budget or floor.  ``capacity`` False leaves out the capacity
        floor (a knapsack per tuple and class set: the heap's first ranking of thousands of
        tuples and ``by_classes`` skip it; a tuple's later bound levels, and what a class set
        must show there, solve._enough_on, read it)."""
        if spec.kind == "throughput":
            return time_s
        if spec.kind == "throughput-under-budget":
            budget = spec.budget_usd_per_hour * (1 + 1e-12)
            if self.price_usd_per_hour > budget:
                return math.inf
            time_s = max(time_s, self.work_usd_s_per_hour / budget)
            if capacity and self.capacity is not None:
                time_s = self.capacity.least_time(budget, self.classes, above_s=time_s)
            return time_s
        if spec.kind == "cost":
            return max(self.price_usd_per_hour * time_s, self.work_usd_s_per_hour)
        cap_s = tokens_per_iteration / spec.min_tokens_per_s
        if time_s > cap_s * (1 + 1e-12):
            return math.inf
        held = (self.capacity.least_price(cap_s, self.classes)
                if capacity and self.capacity is not None else 0.0)
        return max(self.price_usd_per_hour, self.work_usd_s_per_hour / cap_s, held)

    def time_enough(self, spec: ObjectiveSpec, threshold: float, tokens_per_iteration: float) -> float:
        """The time bound from which ``value`` reaches ``threshold`` (what the knob bound is
        asked to show to prune the tuple)."""
        if spec.kind in ("throughput", "throughput-under-budget"):
            return threshold
        if spec.kind == "cost":
            return threshold / self.price_usd_per_hour if self.price_usd_per_hour > 0 else math.inf
        return tokens_per_iteration / spec.min_tokens_per_s * (1 + 1e-12)


def floors_until(pricer: Pricer, ranked, deadline: float) -> dict[Knobs, TupleFloors]:
    """The floors of the ranked tuples (``queue.Ranked``), best bound first, until ``deadline``.

    Each costs a pass over its options' cost lines: on a 6-class cluster of 9,810 tuples,
    34 s, so ``plan --objective cost --time-limit 3`` answered after 28 s (found by
    scripts/fuzz_plans.py).  A tuple left without floors keeps ``TupleFloors(0, 0)``: price
    and work 0 under-estimate every plan's, so its bound stays a true (weak) one, and the
    search, past its deadline, counts it unexplored."""
    floors: dict[Knobs, TupleFloors] = {}
    for t in ranked:
        if clock.now() > deadline:
            break
        clock.charge(len(t.keys) / clock.RANK_PER_UNIT)    # as ranking it: one pass per option
        floors[t.knobs] = tuple_floors(pricer, t.knobs, t.ctx, t.keys)
    return floors


def tuple_floors(pricer: Pricer, knobs: Knobs, ctx, keys: list[OptionKey]) -> TupleFloors:
    """The floors over the options ``keys`` of a knob tuple (module docstring)."""
    if not keys:
        return TupleFloors(math.inf, math.inf)
    unit = knobs.block_unit
    blocks = pricer.model.num_layers // unit
    prices, slopes, icpts, cls = [], [], [], []
    one_class: dict[int, float] = {}      # per class, the least a plan using it rents
    least_share: dict[int, float] = {}    # per class, its cheapest option's rent share
    memo = pricer.floor_terms
    tuple_id = (pricer.cache_id(ctx), knobs.micro_batch_size, unit)
    for key in keys:
        # a mixed stage's stand-in reads the schedule and stage count (option_lines); the
        # others' lines only the context, B and the unit, which the tuples of a search share
        mk = tuple_id + ((key, knobs.schedule, knobs.num_stages) if isinstance(key, StandIn) else (key,))
        terms = memo.get(mk)
        if terms is None:
            terms = memo[mk] = _option_terms(pricer, ctx, knobs, key, unit)
        price, least_rent, slope, per_position = terms
        prices.append(price)
        slopes.append(slope)
        icpts.append(per_position)
        cls.append(key.cls)
        one_class[key.cls] = min(one_class.get(key.cls, math.inf), least_rent)
        least_share[key.cls] = min(least_share.get(key.cls, math.inf), price)
    pi, a, c = np.array(prices), np.array(slopes), np.array(icpts)
    # per unit of blocks, at the worst nb >= 1 for a negative intercept
    r = np.maximum(0.0, a + np.minimum(0.0, c.min(axis=1)))
    # intercepts per stage role (middle, first, last, only): the V schedules put the embedding
    # and the head on their first stage and a middle stage last (SearchSchedule.role_positions)
    by_role = c[:, list(SCHEDULES[knobs.schedule].role_positions())]
    least = (pi[:, None] * np.maximum(by_role, 0.0)).min(axis=0)    # what a stage in the role adds
    p = knobs.num_stages
    added = float(least[Position.ONLY] if p == 1
                  else least[Position.FIRST] + least[Position.LAST] + (p - 2) * least[Position.MIDDLE])
    return TupleFloors(max(p * float(pi.min()), min(one_class.values())),
                       knobs.num_micro_batches * (blocks * float((pi * r).min()) + added),
                       tuple(sorted(one_class.items())), tuple(sorted(least_share.items())), p,
                       Capacity(pi, np.array(cls), a, by_role, knobs.num_micro_batches, blocks, p))


def _option_terms(pricer: Pricer, ctx, knobs: Knobs, key, unit: int):
    """(rent share, least rent of its class, a_o, c_o per position) of one option."""
    (slope_f, slope_b, icpt), _ = pricer.lines(ctx, knobs, key, unit)
    return (key.rent_share_in(pricer.classes), key.least_rent_in(pricer.classes), slope_f + slope_b,
            icpt.sum(axis=1))                         # forward + backward, POSITIONS order
