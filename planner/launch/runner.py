"""The local reference runner: train a plan's exact layout on this machine with PyTorch.

    from planner.launch.runner import run_plan
    result = run_plan(plan, steps=3, backend="gloo", seed=0, model_override=TINY_MODEL)
    result.losses, result.step_time_s, result.param_digest

One process per device of the plan, all on this machine (CPU with gloo, or one visible GPU per
rank with nccl). Each process builds its stage, replicas and tp shard of a decoder-only
transformer of the plan's shape (``planner.launch.tiny_model``) and follows the plan's schedule
(``planner.launch.worker``). Everything is checked before a process starts; a failed rank stops
the others and is named in the error.

This module imports torch only inside functions that need it (nccl checks), so importing
``planner.launch.runner`` stays light; the heavy work happens in the worker processes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import InputError, InputErrors
from planner.launch.processes import WorkerError, _free_port, _launch, _Progress
from planner.plan import Plan
from planner.plan.check import check_layout

PROCS_PER_CORE = 4  # beyond this many CPU processes per core a run is all contention
# --tiny: keeps the plan's number of blocks (and so its stages) but makes every block small.
TINY_MODEL = {"hidden_size": 64, "num_attention_heads": 8, "ffn_hidden_size": 256,
              "vocab_size": 128}
TINY_SEQ_LEN = 16


@dataclass(frozen=True)
class RankInfo:
    rank: int
    device: str
    stage: int
    replica: int
    tp_rank: int


@dataclass
class RunResult:
    """What a run measured. ``losses[i]`` is the global-batch mean token loss of step i (before
    that step's update); ``step_time_s[i]`` the slowest rank's time for step i."""

    losses: list[float]
    step_time_s: list[float]
    param_digest: str  # sha256 over the full parameters (names sorted, float64 bytes)
    replica_max_abs_diff: float  # largest difference between replicas of a stage: 0 when sound
    world_size: int
    ranks: list[RankInfo]
    wall_s: float
    params: dict | None = field(default=None, repr=False)  # name -> numpy array, full shape
    measurements: dict | None = field(default=None, repr=False)  # planner.launch.measurements
    # ZeRO plans: per rank, the bytes of weights / gradients / optimizer state it held (zero_shards)
    zero_state_bytes: dict[int, dict[str, int]] | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        return {"losses": self.losses, "step_time_s": self.step_time_s,
                "param_digest": self.param_digest, "replica_max_abs_diff": self.replica_max_abs_diff,
                "world_size": self.world_size, "wall_s": self.wall_s,
                "ranks": [r.__dict__ for r in self.ranks]}


# -- what to build ---------------------------------------------------------------------------

def model_shape(plan: Plan, model_override: dict | None = None, seq_len: int | None = None) -> dict:
    """Sizes of the model the runner trains: the plan's model with ``model_override`` applied
    (e.g. ``TINY_MODEL``), re-validated, and the sequence length. Returns the keyword arguments
    of ``tiny_model.Shape`` (a plain dict, so this stays torch-free)."""
    from planner.spec.load import load_model

    model = load_model(plan.inputs.model)
    if model_override:
        mapping = model.to_mapping()
        if "num_layers" in model_override and model_override["num_layers"] != model.num_layers:
            raise InputError("model override: num_layers must stay as in the plan "
                             f"({model.num_layers}): the stages hold blocks by index")
        if "num_attention_heads" in model_override and "num_kv_heads" not in model_override:
            # gcd: any tp that divides both the model's kv heads and the new head count still
            # divides the kv heads, so a plan valid for the real model stays valid shrunk.
            mapping["num_kv_heads"] = math.gcd(model.kv_heads, model_override["num_attention_heads"])
        if "hidden_size" in model_override and "ffn_hidden_size" not in model_override:
            mapping["ffn_hidden_size"] = 4 * model_override["hidden_size"]
        mapping.update({k: v for k, v in model_override.items() if k != "seq_len"})
        try:
            model = load_model(mapping)
        except InputError as exc:
            raise InputError(f"model override: {exc}") from None
        seq_len = seq_len or model_override.get("seq_len")
    seq = seq_len or plan.inputs.training.get("seq_len")
    if not isinstance(seq, int) or seq < 1:
        raise InputError("the plan's inputs.training has no seq_len; pass --seq-len")
    if model.is_moe or model.attention_head_dim is not None:
        # tiny_model.py builds dense blocks with head_dim = hidden / heads; training one for a
        # Mixture-of-Experts plan would check a different model than the one planned
        raise InputError(f"the reference runner trains dense models; {model.name} has "
                         + ("experts" if model.is_moe else f"head_dim {model.attention_head_dim}")
                         + ": launch it with --format megatron or torchtitan")
    return {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
            "num_heads": model.num_attention_heads, "num_kv_heads": model.kv_heads,
            "ffn_size": model.ffn_size, "vocab_size": model.vocab_size, "seq_len": seq,
            "mlp": model.mlp, "tied_embeddings": model.tied_embeddings}


def rank_map(plan: Plan) -> list[RankInfo]:
    """One rank per device. The plan's own ``launch.ranks`` when present; otherwise the rule of
    ``planner.plan.rankmap.rank_map``: nodes in the order they first appear in the plan, ranks
    numbered node by node, devices by local index inside a node."""
    slots = {d: (s.index, j, t) for s in plan.stages for j, r in enumerate(s.replicas)
             for t, d in enumerate(r.devices)}
    if plan.launch is not None:
        out = [RankInfo(r.rank, r.device, r.stage, r.replica, r.tp_rank)
               for r in sorted(plan.launch.ranks, key=lambda r: r.rank)]
        ok = ([r.rank for r in out] == list(range(len(slots)))
              and {r.device: (r.stage, r.replica, r.tp_rank) for r in out} == slots)
        if not ok:
            raise InputError("plan.launch.ranks does not number the plan's devices 0..n-1 with "
                             "their stage, replica and tp rank; remove it or fix it")
        return out
    from planner.plan.rankmap import rank_map as plan_rank_map

    return [RankInfo(r.rank, r.device, r.stage, r.replica, r.tp_rank) for r in plan_rank_map(plan).ranks]


def replica_ranks(plan: Plan, ranks: list[RankInfo]) -> list[list[list[int]]]:
    """``[stage][replica]``: the ranks of each plan replica, its tp x cp devices in order (tp
    innermost), as the workers get them."""
    slot_rank = {(r.stage, r.replica, r.tp_rank): r.rank for r in ranks}
    return [[[slot_rank[(s.index, j, t)] for t in range(len(rep.devices))]
             for j, rep in enumerate(s.replicas)] for s in plan.stages]


def check_plan(plan: Plan, shape: dict, schedule=None):
    """Everything the runner cannot run, as one InputError, before anything starts. Returns the
    action lists the workers will follow (``run_schedule.plan_schedule``; ``schedule``, an
    ``actions.Schedule``, overrides the plan's)."""
    from planner.launch.run_schedule import chunk_problems, plan_schedule
    from planner.simulate.actions import ScheduleError

    problems, sched = [], None
    try:  # the layout rules every consumer of a plan shares
        check_layout(plan)
    except InputErrors as exc:
        problems.extend(f"{e.location.field + ': ' if e.location and e.location.field else ''}{e.message}"
                        for e in exc.errors)
    if not problems:
        try:  # the same action lists the workers will follow
            sched = plan_schedule(plan, schedule)
            problems.extend(chunk_problems(plan, sched))
        except ScheduleError as exc:
            problems.append(f"schedule: {exc}")
    cp = plan.context_parallel
    if cp > 1 and shape["seq_len"] % (2 * cp):
        problems.append(f"context_parallel {cp}: the run's seq_len {shape['seq_len']} is not a multiple "
                        f"of 2 x {cp} (after any --tiny/--seq-len)")
    if cp > 1 and plan.schedule == "bitpipe":
        problems.append(f"context_parallel {cp} with schedule bitpipe: the runner's BitPipe workers "
                        "split no sequence")
    for s in plan.stages:  # the (possibly shrunk) shape this run builds
        for j, r in enumerate(s.replicas):
            for what, n in (("attention heads", shape["num_heads"]),
                            ("kv heads", shape["num_kv_heads"]), ("ffn size", shape["ffn_size"])):
                if n % r.tp:
                    problems.append(f"stage {s.index} replica {j}: tp={r.tp} does not divide the "
                                    f"model's {n} {what} (after any --tiny/model override)")
    if plan.zero_stage >= 1:  # planner.launch.zero_shards shards shard-by-shard over equal tp
        # (HSDP's shard and replicate groups too: planner.launch.hsdp_groups)
        if sched is not None and sched.stage_map == "bitpipe":
            problems.append(f"zero_stage: {plan.zero_stage} with the bitpipe schedule (its mirrored "
                            "weight copies are summed apart): the runner shards only other schedules")
        for s in plan.stages:
            if len({r.tp for r in s.replicas}) > 1:
                problems.append(f"zero_stage: {plan.zero_stage} with replicas of different tp in stage "
                                f"{s.index}: the runner shards only stages whose replicas share one tp")
    if problems:
        raise InputError("cannot run this plan:\n  " + "\n  ".join(problems))
    return sched


def model_chunks(plan: Plan, schedule=None) -> list[dict]:
    """The pipeline's pieces in order, entry ``k`` global stage ``k`` of the plan's action lists
    (or of ``schedule``): see ``planner.launch.run_schedule.model_chunks``."""
    from planner.launch.run_schedule import model_chunks as chunks
    from planner.launch.run_schedule import plan_schedule

    return chunks(plan, schedule if schedule is not None else plan_schedule(plan))


def _bytes_per_rank(plan: Plan, shape: dict, dtype_bytes: int, sched) -> int:
    """Rough peak memory of the largest rank: weights, grads and two Adam moments, plus the
    activations of the micro-batches in flight under the action lists ``sched`` (a micro-batch
    holds its graph from F until B or W). Only to refuse runs that cannot fit."""
    from planner.launch.run_schedule import peak_in_flight, weight_stages

    h, f, v, seq = shape["hidden_size"], shape["ffn_size"], shape["vocab_size"], shape["seq_len"]
    block = 4 * h * h + 3 * h * f
    worst = 0
    held = peak_in_flight(sched)
    heads = head_stages(sched)
    for s in plan.stages:
        in_flight = held[s.index]
        # bitpipe: the rank also holds its mirror's blocks (a second copy) and runs them.
        copies = [plan.stages[i] for i in weight_stages(sched, s.index)]
        blocks = sum(c.num_blocks for c in copies)
        ends = any(c.embedding or c.head for c in copies)
        for r in s.replicas:
            n = blocks * block // r.tp + (2 * v * h if ends else 0)
            act = max(c.num_blocks for c in copies) * r.micro_batch_share * seq * (
                12 * h + 3 * f // r.tp + 3 * shape["num_heads"] * seq)
            act += 3 * r.micro_batch_share * seq * v if s.index in heads else 0
            worst = max(worst, (4 * n + in_flight * act) * dtype_bytes)
    return worst


def head_stages(sched) -> set[int]:
    """The plan stages computing a loss: the owner of each pipeline's last stage (bitpipe: two)."""
    return {sched.owner(sched.num_stages - 1, pipe[0])[0] for pipe in sched.pipelines} or \
        {sched.owner(sched.num_stages - 1)[0]}


def check_machine(plan: Plan, shape: dict, backend: str, dtype: str, sched) -> None:
    n = len(plan.devices())
    if backend == "gloo":
        cores = os.cpu_count() or 1
        if n > PROCS_PER_CORE * cores:
            raise InputError(f"the plan has {n} devices, one process each, but this machine has "
                             f"{cores} CPU cores (at most {PROCS_PER_CORE * cores} processes)")
    elif backend == "nccl":
        import torch  # only here: the check needs CUDA's view of the machine

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n > visible:
            raise InputError(f"the plan has {n} devices, one process and GPU each, but {visible} "
                             "CUDA devices are visible" + ("; use --backend gloo" if not visible else ""))
        return
    else:
        raise InputError(f"unknown backend {backend!r}; choose gloo or nccl")
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    need = n * _bytes_per_rank(plan, shape, 8 if dtype == "float64" else 4, sched)
    if need > 0.8 * total:
        raise InputError(f"training this model shape in {n} processes needs about "
                         f"{need / 2**30:.1f} GiB, more than this machine's {total / 2**30:.1f} GiB "
                         "allows; shrink it with --tiny (or a model override) or --seq-len")


def loss_ranks(plan: Plan, ranks: list[RankInfo]) -> set[int]:
    """The ranks whose loss pieces sum to the loss: the first tp rank of each replica, of each
    of its cp ranks with context parallelism (a rank's ``tp_rank`` is its place in the
    replica's devices, tp innermost)."""
    return {r.rank for r in ranks if r.tp_rank % plan.stages[r.stage].replicas[r.replica].tp == 0}


def _collect(out: Path, ranks: list[RankInfo], plan: Plan, steps: int, heads: set[int]):
    import numpy as np

    res = {r.rank: json.loads((out / f"rank{r.rank}.json").read_text()) for r in ranks}
    shards = {r.rank: dict(np.load(out / f"rank{r.rank}.npz")) for r in ranks}
    first = loss_ranks(plan, ranks)
    losses = [sum(res[r.rank]["losses"][i] for r in ranks if r.stage in heads and r.rank in first)
              for i in range(steps)]
    times = [max(res[r.rank]["step_time_s"][i] for r in ranks) for i in range(steps)]
    by_slot = {(r.stage, r.replica, r.tp_rank): r.rank for r in ranks}
    params, diff = {}, 0.0
    for s in plan.stages:
        for j, rep in enumerate(s.replicas):
            for c in range(plan.context_parallel):   # the weights are replicated over the cp ranks
                tp_ranks = [by_slot[(s.index, j, c * rep.tp + t)] for t in range(rep.tp)]
                dims = res[tp_ranks[0]]["split_dims"]
                for name, dim in dims.items():
                    parts = [shards[rk][name] for rk in tp_ranks]
                    full = parts[0] if dim is None or rep.tp == 1 else np.concatenate(parts, axis=dim)
                    if name not in params:
                        params[name] = full
                    else:  # another replica or cp rank, a tied embedding's last-stage copy, bitpipe's
                        diff = max(diff, float(np.max(np.abs(full - params[name]), initial=0.0)))
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(np.ascontiguousarray(params[name], dtype=np.float64).tobytes())
    measured = {r.rank: res[r.rank]["measurements"] for r in ranks if "measurements" in res[r.rank]}
    zero = {r.rank: res[r.rank]["zero_state_bytes"] for r in ranks if "zero_state_bytes" in res[r.rank]}
    return losses, times, params, diff, h.hexdigest(), measured, zero or None


def run_plan(plan: Plan, steps: int = 3, backend: str = "gloo", seed: int = 0,
             model_override: dict | None = None, *, seq_len: int | None = None,
             dtype: str = "float32", optimizer: str = "adam", lr: float = 1e-3,
             timeout_s: float = 600.0, collective_timeout_s: float = 120.0,
             return_params: bool = False, on_step=None, schedule=None,
             measure: bool = False, dynamic=None, slowdown: dict[int, float] | None = None,
             on_shares=None) -> RunResult:
    """Train ``plan`` for ``steps`` steps on this machine; see the module docstring.

    ``schedule`` (a ``planner.simulate.actions.Schedule``) replaces the plan's own action lists:
    the same stages and micro-batches, any order, chunk count or stage map.

    ``measure`` keeps per-step, per-replica times (``RunResult.measurements``, the document of
    ``planner.launch.measurements``); ``dynamic`` (a ``planner.launch.dynamic.ControllerSettings``)
    re-sets the shares between steps (docs/runner.md, "Dynamic batching") and implies
    ``measure``; ``slowdown`` ({rank: factor}) makes ranks that much slower, for benchmarks;
    ``on_shares(step, {(stage, replica): share})`` reports the shares each step ran with.

    ``on_step(step, loss, step_time_s)`` is called from this process as each step completes on
    every rank (for live progress); the returned ``RunResult`` carries the same numbers."""
    if steps < 1:
        raise InputError(f"steps must be at least 1, got {steps}")
    if plan.context_parallel > 1 and (measure or dynamic is not None or slowdown):
        raise InputError(f"context_parallel {plan.context_parallel}: the runner measures and rebalances "
                         "replicas only without context parallelism")
    if dtype not in ("float32", "float64"):
        raise InputError(f"dtype must be float32 or float64, got {dtype!r}")
    if optimizer not in ("adam", "sgd"):
        raise InputError(f"optimizer must be adam or sgd, got {optimizer!r}")
    shape = model_shape(plan, model_override, seq_len)
    sched = check_plan(plan, shape, schedule)
    check_machine(plan, shape, backend, dtype, sched)
    ranks = rank_map(plan)
    from planner.launch.dynamic_run import check_dynamic, dynamic_config
    from planner.launch.run_schedule import schedule_to_json

    check_dynamic(plan, dynamic, slowdown, len(ranks))

    heads = head_stages(sched)  # the plan stages computing the loss
    stages = [{"blocks": list(s.blocks), "embedding": s.embedding, "head": s.head,
               "replicas": [{"share": rep.micro_batch_share, "ranks": rr}
                            for rep, rr in zip(s.replicas, reps)]}
              for s, reps in zip(plan.stages, replica_ranks(plan, ranks))]
    cfg = {"shape": shape, "stages": stages, "chunks": model_chunks(plan, sched),
           "schedule": schedule_to_json(sched), "steps": steps,
           "seed": seed, "dtype": dtype, "optimizer": optimizer, "lr": lr, "backend": backend,
           "micro_batch_size": plan.micro_batch_size, "num_micro_batches": plan.num_micro_batches,
           "global_batch": plan.micro_batch_size * plan.num_micro_batches,
           "context_parallel": plan.context_parallel,
           "world_size": len(ranks), "port": _free_port(), "zero_stage": plan.zero_stage,
           "zero_shard_degree": plan.zero_shard_degree,
           "collective_timeout_s": collective_timeout_s,
           # The runner computes in ``dtype`` (float32 by default) whatever the plan's precision
           # (bf16/fp16 plans too); a tf32 plan also gets TF32 matmuls on a GPU.
           "allow_tf32": dtype == "float32" and plan.inputs.training.get("precision") == "tf32",
           **dynamic_config(measure, dynamic, slowdown)}
    t0 = time.perf_counter()
    for attempt in range(2):
        with tempfile.TemporaryDirectory(prefix="planner-run-") as tmp:
            out = Path(tmp)
            try:
                progress = _Progress(out, ranks, heads, on_step, on_shares)
                progress.loss_ranks = loss_ranks(plan, ranks)
                _launch(cfg, ranks, out, timeout_s, progress)
            except WorkerError as exc:
                # The free port can be taken between our probe and rank 0's bind: try another once.
                if attempt == 0 and getattr(exc, "rank", None) == 0 and "in use" in str(exc).lower():
                    cfg["port"] = _free_port()
                    continue
                raise
            losses, times, params, diff, digest, measured, zero = _collect(out, ranks, plan, steps, heads)
            break
    doc = None
    if measured:
        from planner.launch.measurements import build, trained_record

        trained = trained_record(shape, dtype, backend, cfg["allow_tf32"], cfg.get("slowdown"))
        doc = build(plan, ranks, measured, times, cfg.get("dynamic"), trained)
    return RunResult(losses=losses, step_time_s=times, param_digest=digest,
                     replica_max_abs_diff=diff, world_size=len(ranks), ranks=ranks,
                     wall_s=time.perf_counter() - t0, params=params if return_params else None,
                     measurements=doc, zero_state_bytes=zero)
