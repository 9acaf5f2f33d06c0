"""``planner profile --from-run``: a training run's measured times -> profiles the cost model
reads (issue 21), so the next plan is priced from what the devices did. Torch-free.

``planner run PLAN --measurements FILE`` records, per step and per replica, the compute time of
all the replica's micro-batches in that step (forward + backward with receive waits taken out,
TP collectives in; planner.launch.measurements). For every measured step after ``warmup``
(default 1: the first step carries one-off start-up costs, as in planner.rebalance) and every
replica, this module:

1. takes the replica's compute per micro-batch, ``compute_s / num_micro_batches``;
2. asks the cost model (planner.cost.compute, with the profiles and calibration it would price
   the plan with) for the same replica and share: each layer's forward and backward, and what
   is not a layer's own work (the TP collectives and the per-micro-batch overhead);
3. takes the measured time less that non-layer part and splits it over the stage's layers
   (embedding, its blocks, head) **in the proportion the cost model predicts for them**: one
   factor ``k = (measured - predicted non-layer) / predicted layers`` scales every layer's
   forward and backward.

The total of a stage is measured; how it divides between its layers, and between forward and
backward, is the cost model's (the run's ``forward_s`` / ``backward_s`` include receive waits
that cannot be told apart by direction). Each entry (GPU type, layer kind, micro-batch share,
tp) is the median over all its samples (steps x replicas, over every stage holding the layer).
Replicas of one GPU type that ran at different speeds (a throttled node) get that median: a
profile describes a type, not a node; ``planner rebalance`` is the tool for one slow node.

One profile per GPU type (the file format holds one device); ``write`` puts them in a folder,
``<gpu-type>.yaml`` each, which ``--profiles DIR`` reads. No memory is measured by a run, so
``settings.memory`` is ``not measured`` and the entries have no ``peak_memory_bytes``.
"""

from __future__ import annotations

import datetime as dt
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass

from planner.errors import InputError
from planner.profile.schema import MEMORY_NOT_MEASURED, SCHEMA_ID, ModelShape, ProfileFile

DEFAULT_WARMUP_STEPS = 1
STATISTIC = "median of steps {first}..{last}, split by the cost model's layer ratio"


@dataclass(frozen=True)
class FromRun:
    """What ``profiles_from_run`` made: one profile per GPU type and how the run compared."""

    profiles: dict[str, ProfileFile]       # GPU type -> profile
    steps_used: tuple[int, int]            # first and last measured step used
    # GPU type -> median measured / predicted layer time (k above): > 1, the run was slower
    # than the cost model thought
    scale: dict[str, float]


def _fail(path: str, field: str, why: str) -> InputError:
    return InputError(f"{path}: {field}: {why}")


@dataclass(frozen=True)
class LayerPrices:
    """The cost model's price of one micro-batch on one replica (steps 2 and 3 of the module
    docstring): its layers and what is not a layer's own work."""

    layers: tuple      # (kind, count, one layer's ReplicaTiming)
    overhead_s: float  # the calibration's fixed time per micro-batch

    @property
    def own_s(self) -> float:
        return sum(n * (lt.forward_s + lt.backward_s) for _, n, lt in self.layers)

    @property
    def other_s(self) -> float:
        """TP collectives and the per-micro-batch overhead: not split, taken as priced."""
        return sum(n * lt.tp_comm_s for _, n, lt in self.layers) + self.overhead_s

    def scale(self, per_micro_batch_s: float, path: str, field: str) -> float:
        """``k``: the measured time less ``other_s``, over the layers' predicted time; an
        ``InputError`` on ``path``'s ``field`` when nothing is left to split."""
        measured, own = per_micro_batch_s - self.other_s, self.own_s
        if measured <= 0 or own <= 0:
            raise _fail(path, field, f"{per_micro_batch_s:.6g} s per micro-batch is less than the "
                        f"cost model's TP collectives and per-micro-batch overhead ({self.other_s:.6g} s"
                        "): nothing is left to split over the layers")
        return measured / own


def layer_prices(ctx, gpu, intra_Bps: float, tp: int, share: int, num_blocks: int, embedding: bool,
                 head: bool) -> LayerPrices:
    """A replica of ``tp`` GPUs of ``gpu`` running ``share`` sequences through ``num_blocks``
    blocks (and the embedding / head) as the cost model prices it (planner.cost.compute).
    Shared with ``planner.rebalance_blocks``: one conversion of measurements into layer times."""
    from planner.cost.compute import block_timing, embedding_timing, head_timing

    layers = []
    if embedding:
        layers.append(("embedding", 1, embedding_timing(ctx, gpu, intra_Bps, tp, share)))
    if num_blocks:
        layers.append(("block", num_blocks, block_timing(ctx, gpu, intra_Bps, tp, share)))
    if head:
        layers.append(("head", 1, head_timing(ctx, gpu, intra_Bps, tp, share)))
    return LayerPrices(tuple(layers), ctx.calibration.for_gpu(gpu).microbatch_overhead_s)


def _run_dtype(path: str, trained: dict) -> str:
    """The profile dtype of the run's arithmetic (the runner computes in float32 or float64
    whatever the plan's precision; TF32 matmuls only for a tf32 plan on a GPU)."""
    dtype = trained.get("dtype")
    if dtype == "float32":
        return "tf32" if trained.get("allow_tf32") else "fp32"
    raise _fail(path, "trained.dtype", f"a profile holds fp32 / tf32 / bf16 / fp16 times, the run "
                f"computed in {dtype!r}; measure with `planner run --dtype float32`")


def run_context(plan, path: str, trained: dict, calibration=None, profiles=None):
    """The cost model's context for what the reference runner computed when it trained ``plan``
    (``trained``: the measurements' record, read from ``path``): the run's dtype (float32, TF32
    matmuls for a tf32 plan), attention unfused and the loss as F.cross_entropy on fp32 logits
    (the plain loss), whatever the plan priced (planner/launch/tiny_model.py).  Measured times are
    split over the layers in its proportions, its collectives and overhead taken out (here and in
    planner.rebalance_blocks); the plan's own memory and price keep the plan's context."""
    from planner.cost.evaluate import context_for_plan
    return context_for_plan(plan, calibration, profiles, precision=_run_dtype(path, trained),
                            flash_attention=False, cross_entropy="plain")


def check_trained(path: str, doc: dict, plan) -> dict:
    """The run's ``trained`` record, checked to be the plan's own model and sequence length
    (``--tiny`` or ``--seq-len`` runs train another model, whose times price nothing here)."""
    from planner.launch.runner import model_shape  # torch-free

    trained = doc.get("trained")
    if not isinstance(trained, dict) or not isinstance(trained.get("shape"), dict):
        raise _fail(path, "trained", "missing: the file does not say which model the run trained "
                    "(written before `planner run` recorded it); measure the plan again")
    want = model_shape(plan)
    for key, value in want.items():
        got = trained["shape"].get(key)
        if got != value:
            raise _fail(path, f"trained.shape.{key}", f"the run trained {got!r}, the plan's model has "
                        f"{value!r} (a --tiny or --seq-len run): its times do not price the plan's model")
    return trained


def profiles_from_run(cluster, plan, path: str, warmup: int = DEFAULT_WARMUP_STEPS, profiles=None,
                      calibration=None, note: str | None = None) -> FromRun:
    """Profiles from the measurements file at ``path`` of ``plan`` (module docstring); the cost
    model's prediction uses ``profiles`` and ``calibration`` (None: the roofline / shipped fit)."""
    from planner.cost.evaluate import _priced_stages, _training
    from planner.launch.measurements import load, plan_sha256

    doc, times = load(path, plan)  # hash, replicas, positive times: rebalance's checks
    trained = check_trained(path, doc, plan)
    dtype = _run_dtype(path, trained)
    steps = doc["steps"]
    if warmup < 0 or len(steps) <= warmup:
        raise _fail(path, "steps", f"{len(steps)} measured step(s), none left after {warmup} warm-up "
                    "step(s); run more --steps or lower --warmup")
    seq_len, _, precision = _training(plan)
    ctx = run_context(plan, path, trained, calibration, profiles)
    nodes = cluster.node_by_name
    m = plan.num_micro_batches
    samples: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    factors: dict[str, list[float]] = defaultdict(list)
    gpus = {}
    for st in _priced_stages(plan):
        for j, rep in enumerate(st.replicas):
            node = nodes[rep.node]
            gpu, intra = node.gpu, node.group.intra_Bps
            gpus[gpu.name] = gpu
            t = times[(st.index, j)]
            for i in range(warmup, len(steps)):
                share = t.shares[i]
                prices = layer_prices(ctx, gpu, intra, rep.tp, share, st.num_blocks, st.embedding, st.head)
                k = prices.scale(t.compute_s[i] / m, path, f"steps[{i}] stage {st.index} replica {j} compute_s")
                factors[gpu.name].append(k)
                for kind, _, lt in prices.layers:
                    samples[(gpu.name, kind, share, rep.tp)].append((lt.forward_s * k, lt.backward_s * k))
    first, last = warmup, len(steps) - 1
    statistic = STATISTIC.format(first=first, last=last)
    model = {k: v for k, v in ctx.model.to_mapping().items() if k in ModelShape.model_fields}
    created = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
    gloo = trained.get("backend") == "gloo"
    out = {}
    for name in sorted(gpus):
        entries = []
        for (g, kind, share, tp), pts in sorted(samples.items()):
            if g != name:
                continue
            entries.append({"layer": kind, "micro_batch": share, "tp": tp,
                            "forward_s": statistics.median(f for f, _ in pts),
                            "backward_s": statistics.median(b for _, b in pts)})
        provenance = (f"planner profile --from-run {path}: plan sha256 {plan_sha256(plan)[:16]}, "
                      f"{statistic}: each replica's measured compute per micro-batch, less the cost "
                      "model's TP collectives and per-micro-batch overhead, split over its stage's "
                      "layers (and forward / backward) in the cost model's ratio")
        if trained.get("slowdown"):
            provenance += f"; run slowed ranks {trained['slowdown']} on purpose (--slow-rank)"
        if note:
            provenance += f"; {note}"
        data = {
            "schema": SCHEMA_ID,
            "device": {"kind": "cpu" if gloo else "cuda",
                       "name": trained.get("host_cpu", "cpu") if gloo else name,
                       "gpu_type": name, **({"threads": 1} if gloo else {})},
            "torch_version": str(trained.get("torch_version", "unknown")),
            "dtype": dtype,
            "attention": "unfused",     # the runner's explicit softmax, whatever the plan priced
            # the runner trains any plan in fp32: these times are what the plan's precision got
            "stands_in_for": [precision] if precision != dtype else [],
            "created": created, "seq_len": seq_len, "model": model,
            "settings": {"warmup": warmup, "repeats": last - first + 1, "statistic": "median",
                         "timer": "wall-clock (planner run: perf_counter per action, receive waits "
                                  "out; " + statistic + ")",
                         "memory": MEMORY_NOT_MEASURED,
                         **({"concurrent": len({rk for r in doc["replicas"] for rk in r["ranks"]})}
                            if gloo else {})},
            "provenance": provenance, "entries": entries,
        }
        out[name] = ProfileFile.model_validate(data, context={MEMORY_NOT_MEASURED: True})
    scale = {g: statistics.median(v) for g, v in sorted(factors.items())}
    return FromRun(profiles=out, steps_used=(first, last), scale=scale)


def file_name(gpu_type: str) -> str:
    """``<gpu-type>.yaml``, the name lower-cased with anything but letters, digits, '.', '_'
    and '-' made '-'."""
    return re.sub(r"[^a-z0-9._-]+", "-", gpu_type.lower()).strip("-") + ".yaml"
