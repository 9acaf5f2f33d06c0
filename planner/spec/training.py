"""What to train and the search's freedoms (DESIGN §2: Training)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.spec.quantities import PositiveInt
from planner.spec.source import FieldValueError

# zb-h1, zb-v and dualpipev are searched only when listed: their rows bound their time (docs/search-space.md, "Schedules")
Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev"]
# selective: the attention core only (Korthikanti et al. 2022, Megatron's --recompute-activations);
# op: torchtitan's per-op policy (activation_checkpoint.selective_ac_option "op": every second
# matmul of a block and its elementwise ops recomputed); searched only when listed.
Recompute = Literal["none", "selective", "full", "op"]
# bf16 / fp16: mixed precision (16-bit weights and activations, fp32 master weights and Adam
# state).  fp32: everything in fp32, matmuls on CUDA cores at the FP32 (SIMT) peak, PyTorch's
# default since 1.12 (torch.backends.cuda.matmul.allow_tf32 = False).  tf32: fp32 storage,
# matmuls on TF32 tensor cores (allow_tf32 = True); priced at fp32 on GPUs without them.
Precision = Literal["bf16", "fp16", "fp32", "tf32"]
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp32", "tf32")


# the kernels a job runs, which change its price; plans carry them (Plan.training_choice)
KERNEL_CHOICES = ("attention", "cross_entropy", "elementwise")
# What a plan's inputs.training without the key was priced with, where that differs from the
# field's default today.  Attention's default was "unfused" until most stacks ran a fused kernel
# (Megatron-Core with Transformer Engine, torchtitan, Hugging Face: flash / SDPA) and plans then
# carried only choices off the default, so a plan written before the switch with no "attention"
# priced the unfused core; an absent key keeps that meaning, and io_mapping writes these keys
# whatever their value so that no new plan depends on it.
PLAN_ABSENT_KERNELS = {"attention": "unfused"}


def plan_kernel_choice(training: dict, name: str) -> str:
    """A kernel choice (KERNEL_CHOICES) of a plan's ``inputs.training`` mapping: an absent key
    is what plans without it were priced with (PLAN_ABSENT_KERNELS), else the field's default."""
    if name in training:
        return training[name]
    return PLAN_ABSENT_KERNELS.get(name, Training.model_fields[name].default)


class Training(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # A billion sequences per iteration is beyond any run; the cap keeps the divisor search
    # (sqrt of the batch) from running past the time limit before it starts.
    global_batch_size: PositiveInt = Field(le=10**9, description="sequences per iteration (at most 10^9)")
    seq_len: PositiveInt = Field(description="tokens per sequence")
    precision: Precision = Field(
        default="bf16", description="bf16 | fp16 (mixed precision, 16-bit tensor-core matmuls); "
        "fp32 (4-byte weights, grads and activations, matmuls at the FP32 CUDA-core peak); "
        "tf32 (fp32 storage, matmuls on TF32 tensor cores; fp32 speed where a GPU has none)")
    optimizer: Literal["adam"] = "adam"
    attention: Literal["flash", "unfused"] = Field(
        default="flash", description="the attention core's kernel: flash (the default: one fused kernel, "
        "no s x s scores in memory, recomputed in its backward; FlashAttention / cuDNN / SDPA, what "
        "Megatron-Core with Transformer Engine, torchtitan and Hugging Face run) or unfused (QK^T, "
        "softmax, dropout and the context GEMM as kernels of their own, the s x s scores kept for "
        "backward: Megatron-LM / Megatron-DeepSpeed without --use-flash-attn, and the reference "
        "runner; plans without the key were priced unfused)")
    cross_entropy: Literal["fused", "plain"] = Field(
        default="fused", description="how the loss is computed, which sets the head's peak memory and "
        "the bytes its passes move (planner.cost.cross_entropy): "
        "fused (Megatron's vocab-parallel cross-entropy: the fp32 logits buffer is reused in place "
        "for the softmax and its gradient); plain (torch.nn.functional.cross_entropy on an fp32 "
        "copy of the logits, as torchtitan and Hugging Face Trainer do: the log-probabilities it "
        "keeps, and in backward two more fp32 tensors of the logits' size)")
    elementwise: Literal["fused", "eager"] = Field(
        default="fused", description="how a block's memory-bound ops (norms, rotary embedding, "
        "activation, residual adds) run, which sets the bytes they move (planner.cost.elementwise): "
        "fused (a few fused kernels: Megatron-Core with Transformer Engine, Apex's fused kernels, "
        "torch.compile); eager (every PyTorch op a kernel of its own, forward and autograd backward: "
        "torchtitan and Hugging Face without torch.compile)")
    # The search's freedoms.
    schedules: tuple[Schedule, ...] = ("1f1b", "gpipe", "interleaved-1f1b")
    recompute_modes: tuple[Recompute, ...] = ("none", "selective", "full")
    # ZeRO stages (Rajbhandari et al. 2020): 1 shards the optimizer state, 2 also the gradients,
    # 3 also the parameters (FSDP2).  2 and 3 are searched only when listed (docs/search-space.md).
    zero_stages: tuple[Literal[0, 1, 2, 3], ...] = (0, 1)
    reshard_after_forward: tuple[bool, ...] = Field(
        default=(True,), description="ZeRO-3 only: the values of FSDP2's reshard_after_forward to try "
        "(true: free the gathered parameters after each forward and gather them again in backward; "
        "false: keep them gathered from the first forward to the last backward)")
    zero_shard_degrees: tuple[PositiveInt | Literal["all", "node"], ...] = Field(
        default=("all",), description="ZeRO stages 1-3: the HSDP shard-group sizes to try, in replicas of "
        "a stage (each must divide a stage's replica count; the groups replicate each other); "
        "\"all\": shard over all of a stage's replicas (plain ZeRO / FSDP); \"node\": the replicas "
        "one node holds (GPUs per node / (tp x cp), for each node class and tp)")
    context_parallel_degrees: tuple[PositiveInt, ...] = Field(
        default=(1,), description="context-parallel degrees to try (ring attention: each sequence split "
        "over cp x tp GPUs of a replica, load-balanced for causal attention as 2 cp chunks, so seq_len "
        "must be a multiple of 2 cp); 1 = no split")
    max_tp: PositiveInt = Field(default=8, description="largest tensor-parallel degree")
    expert_parallel_degrees: tuple[PositiveInt, ...] = Field(
        default=(1,), description="MoE models: expert-parallel degrees to try (consecutive replicas "
        "of a stage splitting the experts; planner.cost.moe); dense models take 1 whatever is listed")
    micro_batch_sizes: tuple[PositiveInt, ...] | None = Field(
        default=None, description="per-replica micro-batch sizes to try; default powers of two")
    max_stages: PositiveInt | None = None
    sequence_parallel: bool = Field(default=True, description="use sequence parallelism when tp > 1")
    mixed_stages: bool = Field(
        default=False, description="also search stages whose replicas mix two node classes of one zone "
        "(GPU type and TP per kind, uneven micro-batch shares); slower to prove on clusters of such zones")

    @model_validator(mode="after")
    def _non_empty(self):
        for name in ("schedules", "recompute_modes", "zero_stages", "reshard_after_forward", "zero_shard_degrees",
                     "context_parallel_degrees", "expert_parallel_degrees"):
            if not getattr(self, name):
                raise FieldValueError(name, f"{name} must list at least one choice")
        bad = [cp for cp in self.context_parallel_degrees if cp > 1 and self.seq_len % (2 * cp)]
        if bad:
            raise FieldValueError("context_parallel_degrees",
                                  f"context_parallel_degrees {bad[0]}: seq_len {self.seq_len} must be a "
                                  f"multiple of 2 x {bad[0]} = {2 * bad[0]} (the sequence splits into 2 cp "
                                  "chunks, two per GPU, to balance causal attention)")
        if self.micro_batch_sizes is not None and not self.micro_batch_sizes:
            raise FieldValueError("micro_batch_sizes", "micro_batch_sizes must list at least one size "
                                  "(or be left out: any share)")
        return self

    def shard_degrees(self, per_node: tuple[int, ...] = ()) -> tuple[int | None, ...]:
        """``zero_shard_degrees`` with "all" as None (the plan field's absent value) and "node"
        as ``per_node``, the replica counts one node holds."""
        out: list[int | None] = []
        for d in self.zero_shard_degrees:
            out += [None] if d == "all" else list(per_node) if d == "node" else [d]
        return tuple(dict.fromkeys(out))

    def io_mapping(self) -> dict:
        """The part of the training spec a plan carries in ``inputs.training``."""
        out = {"global_batch_size": self.global_batch_size, "seq_len": self.seq_len,
               "precision": self.precision}
        # Off the default only, so plans keep their bytes, except where an absent key means
        # something else than today's default (PLAN_ABSENT_KERNELS): those are always written.
        for name in KERNEL_CHOICES:
            if name in PLAN_ABSENT_KERNELS or getattr(self, name) != type(self).model_fields[name].default:
                out[name] = getattr(self, name)
        if self.mixed_stages:   # replan searches the same space again
            out["mixed_stages"] = True
        if self.context_parallel_degrees != (1,):   # likewise; the default leaves plans' bytes alone
            out["context_parallel_degrees"] = list(self.context_parallel_degrees)
        if self.zero_shard_degrees != ("all",):
            out["zero_shard_degrees"] = list(self.zero_shard_degrees)
        if self.expert_parallel_degrees != (1,):
            out["expert_parallel_degrees"] = list(self.expert_parallel_degrees)
        return out
