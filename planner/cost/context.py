"""What every cost function needs besides the piece being priced: ``CostContext``.

The search prices pieces (a replica, a stage boundary, a stage's gradient sync) without
building plans; it builds one ``CostContext`` per (model, training knobs) and calls the pure
functions of ``compute``, ``comm``, ``memory`` and ``schedule`` with it.  The context also
holds the caches that keep ``evaluate`` fast (per (GPU, tp, share, blocks) timings, paths).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from planner.cost.calibration import Calibration, default_calibration
from planner.spec.model import ModelSpec


class Profiles(Protocol):
    """Measured per-layer times (planner.profile.ProfileSet implements this)."""

    def lookup(self, gpu_name: str, layer_kind: str, micro_batch: int, tp: int, seq_len: int,
               model: ModelSpec) -> tuple[float, float] | None: ...


# Bytes of one activation / parameter element in mixed precision (bf16 or fp16).
ACTIVATION_BYTES = 2
# Precisions that keep weights, activations and gradients in fp32 (4 bytes) and have no master
# copy: fp32 (matmuls on CUDA cores) and tf32 (matmuls on TF32 tensor cores, fp32 storage).
FULL_PRECISIONS = ("fp32", "tf32")


def element_bytes(precision: str) -> int:
    """Bytes of one activation (and working weight) element when training in ``precision``:
    2 in mixed precision (bf16, fp16), 4 in fp32 and tf32."""
    return 4 if precision in FULL_PRECISIONS else ACTIVATION_BYTES


def grad_bytes(precision: str) -> int:
    """Bytes of one gradient element in memory and on the wire (see
    ``CostContext.grad_bytes_per_param``): fp32 grads with bf16, fp32 and tf32, fp16 with fp16."""
    return 2 if precision == "fp16" else 4


@dataclass(frozen=True, eq=False)
class CostContext:
    """Model and global training knobs, calibration and profiles; caches ride along.

    ``grad_reduce_overlap``: the data-parallel gradient reduction overlaps the backward pass
    of the last micro-batch (Megatron ``--overlap-grad-reduce``); when False it is fully
    exposed (Megatron's default without the flag, and vTrain's measured runs).
    With ZeRO-1 the parameter all-gather then hides behind the first micro-batch's forward
    (``--overlap-param-gather``).
    ``tp_comm_overlap``: TP collectives are pipelined with the neighbouring GEMMs (Megatron-Core
    ``--tp-comm-overlap`` with Transformer Engine userbuffers): only the part of a block's
    collectives longer than its dense GEMMs is exposed.
    ``flash_attention``: the softmax/dropout of attention is fused (no s^2 memory traffic,
    no s^2 activations); the Korthikanti activation formulas assume it off.
    ``context_parallel``: each sequence is split over this many GPUs (groups of tp) of a replica
    (ring attention; planner.cost.comm.cp_ring_exposed_s): every GPU computes s / cp of the
    tokens and 1/cp of the attention core, holds 1/cp of the activations, and the weights are
    replicated over the cp ranks, which join the gradient reduction.
    """

    model: ModelSpec
    seq_len: int
    precision: str = "bf16"
    recompute: str = "none"
    sequence_parallel: bool = False
    context_parallel: int = 1
    zero_stage: int = 0
    # ZeRO-3 only (FSDP2): free the gathered parameters after each forward (planner.cost.comm.zero_gathers)
    reshard_after_forward: bool = True
    # HSDP: the ZeRO shards span groups of this many consecutive replicas of a stage (x cp), the
    # groups replicate each other (planner.cost.hsdp); None: one group of all the replicas
    zero_shard_degree: int | None = None
    # micro-batches per iteration: ZeRO-2/3 reduce-scatter the gradients after each one (and
    # ZeRO-3 gathers the parameters again for each)
    num_micro_batches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    # MoE: each group of this many replicas of a stage splits the experts (planner.cost.moe)
    expert_parallel: int = 1
    calibration: Calibration = field(default_factory=default_calibration)
    profiles: Any = None
    grad_reduce_overlap: bool = True
    flash_attention: bool = False
    tp_comm_overlap: bool = False
    # the loss kernel (Training.cross_entropy): "plain" keeps more fp32 logit-sized tensors
    cross_entropy: str = "fused"
    # the block's elementwise ops (Training.elementwise): "eager" prices every PyTorch op's pass
    # (planner.cost.elementwise), "fused" Megatron's fused kernels (planner.cost.roofline)
    elementwise: str = "fused"
    cache: dict = field(default_factory=dict, repr=False)
    sources: dict = field(default_factory=dict, repr=False)  # cost entry -> measured|estimated
    # cost entry -> how a measurement was re-priced for the plan's kernels (compute.py)
    repriced: dict = field(default_factory=dict, repr=False)

    def variant(self, **changes) -> CostContext:
        """This context with ``changes`` and its caches and records fresh: they key by GPU and
        shape, not by the knobs changed (a measurement's kernels, a memory hint's recompute)."""
        return replace(self, cache={}, sources={}, repriced={}, **changes)

    @classmethod
    def from_plan(cls, plan, model: ModelSpec, seq_len: int, precision: str = "bf16",
                  calibration: Calibration | None = None, profiles=None, **extra) -> CostContext:
        return cls(model=model, seq_len=seq_len, precision=precision, recompute=plan.recompute,
                   sequence_parallel=plan.sequence_parallel,
                   context_parallel=getattr(plan, "context_parallel", 1), zero_stage=plan.zero_stage,
                   reshard_after_forward=plan.reshards_after_forward,
                   zero_shard_degree=getattr(plan, "zero_shard_degree", None),
                   num_micro_batches=plan.num_micro_batches,
                   schedule=plan.schedule, virtual_stages=plan.virtual_stages,
                   expert_parallel=getattr(plan, "expert_parallel", 1),
                   calibration=calibration or default_calibration(), profiles=profiles, **extra)

    @property
    def local_seq_len(self) -> float:
        """Tokens of each sequence one GPU of a replica holds: s / cp (context parallelism)."""
        return self.seq_len / self.context_parallel

    def shard_group(self, num_replicas: int) -> int:
        """Replicas per ZeRO shard group in a stage of ``num_replicas`` (HSDP's
        ``zero_shard_degree``, at most all of them); the shards span that many x cp GPUs."""
        d = self.zero_shard_degree
        return num_replicas if d is None else max(1, min(d, num_replicas))

    @property
    def gradient_reductions(self) -> int:
        """Gradient reduce-scatters per iteration: one per micro-batch with ZeRO-2 and ZeRO-3
        (sharded gradients cannot accumulate whole; planner.cost.comm), else one."""
        return self.num_micro_batches if self.zero_stage >= 2 else 1

    @property
    def activation_bytes(self) -> int:
        """Bytes of one activation element (and of a working weight on the wire, e.g. the
        ZeRO-1 parameter all-gather): 2 in bf16/fp16, 4 in fp32/tf32 (``element_bytes``)."""
        return element_bytes(self.precision)

    @property
    def grad_bytes_per_param(self) -> int:
        """Bytes of one gradient element on the wire and in memory.

        Megatron keeps and all-reduces fp32 main grads with bf16 (it sets
        ``accumulate_allreduce_grads_in_fp32`` for bf16), fp16 grads with fp16; this is the
        "bf16 param, fp32 grads" / "fp16 param, fp16 grads" rows of the distributed-optimizer
        docs (docs/source/api-guide/dist_optimizer.md).  fp32 and tf32 train fp32 weights, so
        their grads are fp32 too.
        """
        return grad_bytes(self.precision)
