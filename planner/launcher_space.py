"""The search space a launcher can run, where it is narrower than the training's freedoms.

``plan --launcher deepspeed`` planned selective recompute and interleaved schedules, and
``launch --format deepspeed`` then refused the plan (planner/launch/deepspeed.py ``check``:
PipelineModule checkpoints whole layers only, its engine runs one stage per rank).  The search
is narrowed to what the launcher runs instead; a test holds this table to ``check``'s
refusals.  The schedules come from the search's own registry (``planner.search.schedules``,
each entry names the launchers that run it), so there is one list of them: Megatron-LM runs
every searched schedule but zb-h1, DeepSpeed 1F1B and GPipe; recompute is narrowed here
(DeepSpeed: none and full; Megatron-LM: all but torchtitan's per-op mode)."""

from __future__ import annotations

from planner.errors import InputError
from planner.search.schedules import LAUNCHERS, SCHEDULES
from planner.spec.training import Training

# launcher -> training field -> the choices it runs
LAUNCHER_CHOICES: dict[str, dict[str, tuple]] = {
    name: {"schedules": tuple(s.name for s in SCHEDULES.values() if name in s.launchers)}
    for name in LAUNCHERS}
# PipelineModule checkpoints whole layers only (activation_checkpoint_interval)
LAUNCHER_CHOICES["deepspeed"]["recompute_modes"] = ("none", "full")
# its JSON config has no expert parallelism (launch/deepspeed.py): the search dropped EP > 1
# and searched EP 1 even where the training allowed only EP 2 (found by scripts/fuzz_plans.py)
LAUNCHER_CHOICES["deepspeed"]["expert_parallel_degrees"] = (1,)
# nor context parallelism or hybrid sharding (launch/deepspeed.py): `--context-parallel 2` alone
# left no knob tuple and the answer blamed memory; `--zero-shard-degree 2` alone searched "all"
LAUNCHER_CHOICES["deepspeed"]["context_parallel_degrees"] = (1,)
LAUNCHER_CHOICES["deepspeed"]["zero_shard_degrees"] = ("all",)
# Megatron-LM's --recompute-granularity is full or selective (the attention core); torchtitan's
# per-op mode ("op") it has not: `plan --launcher megatron --recompute op` wrote a plan that
# `launch --format megatron` refused (found by scripts/fuzz_plans.py)
LAUNCHER_CHOICES["megatron"]["recompute_modes"] = ("none", "selective", "full")


def narrow(training: Training, launcher: str | None) -> Training:
    """``training`` with each freedom cut to what ``launcher`` runs; none left is an input error."""
    update = {}
    for field, runs in LAUNCHER_CHOICES.get(launcher or "", {}).items():
        allowed = getattr(training, field)
        kept = tuple(c for c in allowed if c in runs)
        if not kept:
            raise InputError(f"--launcher {launcher} runs {field} {', '.join(map(str, runs))}; the training "
                             f"allows only {', '.join(map(str, allowed))}")
        if kept != allowed:
            update[field] = kept
    return training.model_copy(update=update) if update else training
