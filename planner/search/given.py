"""Plans handed to the search whole, as its first incumbents (``solve(..., incumbents=[plan])``):
``planner replan`` gives the old plan, repaired after lost nodes (issue 18).

Such a plan is priced by ``planner.cost.evaluate`` on the search's cluster with the search's
training (its inputs replaced, as the answer's will be), keyed under the
objective like any candidate and added to ``Best`` before anything else, so its value is the
cutoff from the start: knob tuples whose bound cannot beat it are pruned, warm starts and MILPs
get it as their cutoff, and the answer is never worse than it.  When nothing beats it, the
answer is that plan itself with its devices as named (a plan found again by the search would
come back with the search's own device names, moving state for nothing).
"""

from __future__ import annotations

from planner.errors import InputError
from planner.plan.model import PlanInputs
from planner.search.incumbent import Candidate
from planner.search.knobs import Knobs


def knobs_of(plan) -> Knobs:
    """The plan's global choices as the search's knob tuple."""
    return Knobs(micro_batch_size=plan.micro_batch_size, num_micro_batches=plan.num_micro_batches,
                 schedule=plan.schedule, virtual_stages=plan.virtual_stages, recompute=plan.recompute,
                 zero_stage=plan.zero_stage, num_stages=plan.num_stages,
                 reshard_after_forward=plan.reshards_after_forward, zero_shard_degree=plan.zero_shard_degree,
                 context_parallel=plan.context_parallel, expert_parallel=plan.expert_parallel)


def given_candidates(cluster, model, training, spec, plans, profiles, admits) -> list[Candidate]:
    """The plans of ``plans`` that run on ``cluster`` and meet the objective's constraints
    (``admits``), as candidates; one that does not fit memory or runs another batch is left
    out: it is no answer for this search."""
    from planner.cost import evaluate

    out = []
    for i, plan in enumerate(plans):
        if plan.micro_batch_size * plan.num_micro_batches != training.global_batch_size:
            raise InputError(f"incumbent plan {i}: {plan.micro_batch_size} x {plan.num_micro_batches} sequences "
                             f"per iteration, the training's global batch is {training.global_batch_size}")
        # priced with this search's training (precision, sequence length, kernels), as the
        # answer as_answer would make of it: the plan's own inputs may say otherwise (a flash
        # plan given to a search of the unfused core), and the cutoff must be the answer's price
        ev = evaluate(cluster, _with_training(plan, training), profiles=profiles, model=model, check=False)
        if not ev.fits:
            continue
        # the search prices node rent only (objectives.py: egress is added by the final evaluation)
        price = ev.nodes_usd_per_hour or 0.0
        cand = Candidate(spec.key(price, ev.iteration_time_s), ev.iteration_time_s, price, knobs_of(plan), [],
                         plan=plan)
        if admits(cand):
            out.append(cand)
    return out


def _with_training(plan, training):
    """``plan`` with its ``inputs.training`` this search's (what ``as_answer`` writes)."""
    return plan.model_copy(update={"inputs": plan.inputs.model_copy(update={"training": training.io_mapping()})})


def as_answer(cand: Candidate, cluster, model, training, objective):
    """A given candidate's plan, its inputs those of this search (the cluster it now runs on)
    and its prediction, solver report and rank map cleared for ``finish`` to set."""
    inputs = PlanInputs(cluster=cluster.name, cluster_sha256=cluster.sha256(), model=model.to_mapping(),
                        training=training.io_mapping())
    return cand.plan.model_copy(update={"inputs": inputs, "objective": objective, "predicted": None,
                                        "solver": None, "launch": None})
