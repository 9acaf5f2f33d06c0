"""``Evaluation``: a plan's predicted performance, term by term."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.cost.memory import MemoryBreakdown
from planner.cost.schedule import StageTiming, breakdown_keys

# What each breakdown term is and where its formula comes from (shown by explain()).
TERM_FORMULAS = {
    "compute": "m x forward+backward compute of the bottleneck stage's slowest replica: each "
               "GEMM (qkv, attention core, projection, MLP, head; backward: dgrad + wgrad) at "
               "2MNK / (peak x eff(MN, K)) + elementwise and attention-core bytes / mem BW, "
               "at least the launch floor (eff: saturating in output size and depth through "
               "the GPU's published max achievable matmul; FLOPs: Narayanan et al. SC21)",
    "recompute": "m x recomputed forward (selective: attention core; full: whole block; op: every "
                 "second matmul and the elementwise ops, torchtitan) "
                 "(Korthikanti et al. 2022)",
    "tp_comm": "m x TP collectives, 2 fwd + 2 bwd per block of b s h bytes, ring "
               "2(t-1)/t S/B + 2(t-1) alpha on the intra-node link at NCCL's published bus "
               "bandwidth (nccl-tests) (Shoeybi et al. 2019; Patarasuk & Yuan 2009)",
    "cp_comm": "m x the context-parallel K/V ring's exposed sends, per block forward (cp-1) "
               "max(0, send - core/cp), backward (cp-1) max(0, 2 send - core backward/cp) "
               "(K/V and their gradients), send = 2 kv_heads/tp x head_dim x s/cp x b elements "
               "to the ring neighbour on the node's GPU link (Liu et al. 2023, ring attention; "
               "Megatron-Core context parallelism)",
    "pp_comm": "m x v x activation + gradient sends of b s h bytes to the neighbour stages "
               "over the real path, busiest replica (Narayanan et al. SC21 §4.1)",
    "bubble": "pipeline time - m x bottleneck cycle; 1F1B: F + (m-1) max c_s "
              "(Narayanan et al. SC21 §2.2; interleaved: fill / v)",
    "ep_comm": "m x expert-parallel all-to-alls of the bottleneck stage: per MoE layer a "
               "dispatch and a combine forward and again backward, each GPU sending tokens x "
               "top_k x h x bytes x (ep-1)/ep over the real links to its group's peers, the "
               "busiest GPU of the slowest group setting the pace (GShard; planner.cost.moe)",
    "dp_sync_exposed": "max over stages of gradient all-reduce (ZeRO-1: reduce-scatter + "
                       "all-gather) over the stage's replicas, ring bound by the slowest hop, "
                       "less the last micro-batch's backward when overlapped",
    "optimizer": "max over stages of the optimizer-side passes (Adam step, grad-norm, grad "
                 "zeroing, fp16 unscale), 36-46 bytes per local parameter / mem BW "
                 "(state layout: Megatron distributed-optimizer docs)",
}


@dataclass
class Evaluation:
    iteration_time_s: float
    tokens_per_s: float
    samples_per_s: float
    mfu: float
    usd_per_hour: float | None
    usd_per_million_tokens: float | None
    breakdown_s: dict[str, float]
    peak_memory_bytes: dict[str, float]
    memory_capacity_bytes: dict[str, float]
    fits: bool
    memory_problems: list[str]
    stages: list[StageTiming]
    pipeline_time_s: float = 0.0
    bottleneck_stage: int = 0
    model_flops_per_iteration: float = 0.0
    nodes_usd_per_hour: float | None = None
    egress_usd_per_hour: float = 0.0
    memory_by_replica: list[list[MemoryBreakdown]] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    repriced: dict[str, str] = field(default_factory=dict)   # measured costs re-priced for the plan's kernels
    schedule: str = "1f1b"
    num_micro_batches: int = 1
    virtual_stages: int = 1
    details: list[tuple[str, float, str]] = field(default_factory=list)  # extra explain rows
    trust: list = field(default_factory=list)  # planner.cost.trust.Trust per GPU type used

    def predicted(self):
        from planner.plan.model import Predicted
        return Predicted(
            iteration_time_s=self.iteration_time_s, tokens_per_s=self.tokens_per_s,
            samples_per_s=self.samples_per_s, mfu=self.mfu, usd_per_hour=self.usd_per_hour,
            usd_per_million_tokens=self.usd_per_million_tokens,
            breakdown_s={k: self.breakdown_s[k] for k in breakdown_keys(self.breakdown_s)},
            peak_memory_bytes=dict(sorted(self.peak_memory_bytes.items())),
            trust=[t.to_json() for t in self.trust] or None)

    def explain(self) -> list[tuple[str, float, str]]:
        """(term, value, formula / source) rows: the seven terms, then the totals."""
        rows = [(k, self.breakdown_s[k], TERM_FORMULAS[k]) for k in breakdown_keys(self.breakdown_s)]
        rows.append(("iteration_time_s", self.iteration_time_s,
                     (f"sum of the terms; pipeline {self.pipeline_time_s:.4g} s with "
                     f"{self.schedule}, m={self.num_micro_batches}, v={self.virtual_stages}, "
                     f"bottleneck stage {self.bottleneck_stage}")))
        rows.append(("tokens_per_s", self.tokens_per_s, "global batch x seq_len / iteration time"))
        rows.append(("mfu", self.mfu, ("model FLOPs (3 x forward, no recompute; Narayanan SC21) "
                     "/ (sum of used GPUs' peak x iteration time)")))
        if self.usd_per_hour is not None:
            rows.append(("usd_per_hour", self.usd_per_hour,
                         f"nodes {self.nodes_usd_per_hour:.4g} + egress {self.egress_usd_per_hour:.4g}"))
            rows.append(("usd_per_million_tokens", self.usd_per_million_tokens or 0.0,
                         "usd_per_hour / (tokens_per_s x 3600) x 1e6"))
        rows.extend(self.details)
        return rows

    def to_json(self) -> dict:
        data = self.predicted().model_dump(mode="json")
        data["fits"] = self.fits
        data["memory_problems"] = list(self.memory_problems)
        data["memory_capacity_bytes"] = dict(sorted(self.memory_capacity_bytes.items()))
        data["stages"] = [dict(vars(s)) for s in self.stages]
        data["explain"] = [{"term": t, "value": v, "formula": f} for t, v, f in self.explain()]
        data["sources"] = dict(sorted(self.sources.items()))
        if self.repriced:
            data["repriced"] = dict(sorted(self.repriced.items()))
        return data
