"""What every launch format shares: the options, the rank layout, the subset checks, and how
files are spelled (sorted JSON, POSIX shell).

Terms: a *chain* is replica ``r`` of every stage (the ranks a micro-batch share flows through);
a *virtual chunk* is one of the ``virtual_stages`` slices of a stage under interleaved 1F1B.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from planner.errors import InputError, InputErrors
from planner.plan import Plan
from planner.plan.model import V_SCHEDULES

DEFAULT_MASTER_PORT = 29500
# Node names become file names and torchrun arguments; the cluster spec allows the same set.
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
LOCALHOST = "localhost"     # a single node's rendezvous when no --master-addr is given
# A host name, IPv4 address or bracketed IPv6 address: nothing a shell would interpret.
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9_.\-]*)$")


@dataclass(frozen=True)
class LaunchOptions:
    """What a user adds to a plan to launch it; ``script`` None means the format's default."""

    master_addr: str | None = None
    master_port: int = DEFAULT_MASTER_PORT
    script: str | None = None
    gpus_per_node: dict[str, int] | None = None  # from a cluster spec, when one is given
    schedule_csv: bool = False  # run the schedule from its action lists even where torch has a class

    def checked_master(self, first_node: str, num_nodes: int) -> tuple[str, int]:
        """The rendezvous address and port; on a single node localhost unless given (every
        process runs there; --master-addr was required even then)."""
        addr = self.master_addr
        if not addr:
            if num_nodes > 1:
                raise InputError(f"launch: --master-addr is required: the host name or IP address of "
                                 f"node rank 0 ({first_node!r}), which every node can reach")
            addr = LOCALHOST
        if not _HOST.match(addr):
            raise InputError(f"launch: --master-addr {addr!r} is not a host name, an IPv4 "
                             "address or a bracketed IPv6 address such as [fd00::1]")
        if isinstance(self.master_port, bool) or not isinstance(self.master_port, int) \
                or not 1 <= self.master_port <= 65535:
            raise InputError(f"launch: --master-port {self.master_port!r} must be an integer in 1..65535")
        return addr, self.master_port


@dataclass(frozen=True)
class RankSlot:
    """One process: its global rank, where it runs and which piece of the plan it computes."""

    rank: int
    node: str
    local_rank: int
    device: str
    stage: int
    replica: int
    tp_rank: int

    @property
    def gpu_index(self) -> int:
        return int(self.device.rpartition(":")[2])

    def to_json(self) -> dict:
        return {"rank": self.rank, "node": self.node, "local_rank": self.local_rank,
                "device": self.device, "stage": self.stage, "replica": self.replica,
                "tp_rank": self.tp_rank}


@dataclass(frozen=True)
class NodeSlot:
    node: str
    node_rank: int
    ranks: tuple[RankSlot, ...]

    @property
    def nproc(self) -> int:
        return len(self.ranks)

    def visible_devices(self, gpus_per_node: int | None) -> str | None:
        """CUDA_VISIBLE_DEVICES so that LOCAL_RANK i lands on the device rank i was given; None
        when the identity over all of the node's GPUs already does that."""
        order = [r.gpu_index for r in self.ranks]
        identity = list(range(gpus_per_node if gpus_per_node is not None else len(order)))
        return None if order == identity else ",".join(str(i) for i in order)


@dataclass(frozen=True)
class Layout:
    """Ranks numbered node by node (what torchrun's static rendezvous does), nodes in order."""

    nodes: tuple[NodeSlot, ...]
    rank_order: str = "plan"  # how global ranks were numbered, written into rank_map.json

    @property
    def world_size(self) -> int:
        return sum(n.nproc for n in self.nodes)

    @property
    def ranks(self) -> list[RankSlot]:
        return [r for n in self.nodes for r in n.ranks]

    def rank_of(self) -> dict[tuple[int, int, int], int]:
        """(stage, replica, tp_rank) -> global rank."""
        return {(r.stage, r.replica, r.tp_rank): r.rank for r in self.ranks}


@dataclass(frozen=True)
class Chunk:
    """A model piece one PipelineStage (or Megatron virtual stage) holds, blocks [first, last)."""

    index: int  # global stage index in the schedule: chunk * num_stages + stage
    stage: int
    chunk: int
    first: int
    last: int
    embedding: bool
    head: bool

    def to_json(self) -> dict:
        return {"index": self.index, "stage": self.stage, "virtual_chunk": self.chunk,
                "blocks": [self.first, self.last], "embedding": self.embedding, "head": self.head}


@dataclass
class Problems:
    """Collects refusals so a user sees every reason a plan does not fit a format at once."""

    fmt: str
    items: list[str] = field(default_factory=list)

    def add(self, message: str) -> None:
        self.items.append(message)

    def raise_if_any(self) -> None:
        if len(self.items) == 1:
            raise InputError(f"launch --format {self.fmt}: {self.items[0]}")
        if self.items:
            raise InputErrors([InputError(f"launch --format {self.fmt}: {m}") for m in self.items])


# -- plan facts ---------------------------------------------------------------------------------
def num_layers(plan: Plan) -> int:
    return plan.stages[-1].blocks[1]


def precision(plan: Plan) -> str:
    return str(plan.inputs.training.get("precision", "bf16"))


# PyTorch's switch for TF32 matmuls is torch.backends.cuda.matmul.allow_tf32 (False by default
# since 1.12).  TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 forces it on for cuBLAS from outside the
# script (PyTorch docs, "CUDA Environment Variables"); on ROCm PyTorch also needs
# HIPBLASLT_ALLOW_TF32=1 (pytorch/pytorch PR 143549).  NVIDIA_TF32_OVERRIDE can only turn TF32
# *off*, so it is not used.
TF32_ENV = {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}
ROCM_TF32_ENV = {"HIPBLASLT_ALLOW_TF32": "1"}


def _amd_plan(plan: Plan) -> bool:
    from planner import catalog
    for gpu_type in {r.gpu_type for s in plan.stages for r in s.replicas}:
        found = catalog.find_gpu(gpu_type)
        if found is not None and found.vendor == "amd":
            return True
    return False


def precision_env(plan: Plan) -> dict[str, str]:
    """Environment the node scripts export for the plan's precision: for tf32, the switches
    that make PyTorch's fp32 matmuls use TF32 tensor cores; nothing otherwise (bf16/fp16 are
    the framework's flags, fp32 is PyTorch's default)."""
    if precision(plan) != "tf32":
        return {}
    return {**TF32_ENV, **(ROCM_TF32_ENV if _amd_plan(plan) else {})}


def precision_comment(plan: Plan) -> list[str]:
    """Node-script comment lines on how the plan's precision is set up."""
    prec = precision(plan)
    if prec == "tf32":
        return ["tf32: fp32 weights and activations, matmuls on TF32 tensor cores; the export of",
                "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 below has the effect of",
                "torch.backends.cuda.matmul.allow_tf32 = True (off by default)."]
    if prec == "fp32":
        return ["fp32: weights, activations and matmuls in fp32",
                "(torch.backends.cuda.matmul.allow_tf32 stays False, PyTorch's default)."]
    return []


def seq_len(plan: Plan) -> int:
    value = plan.inputs.training.get("seq_len")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InputError("launch: the plan's inputs.training.seq_len must be a positive integer, "
                         f"got {value!r}")
    return value


def global_batch_size(plan: Plan) -> int:
    return plan.micro_batch_size * plan.num_micro_batches


def check_structure(plan: Plan, fmt: str) -> None:
    """What every format relies on: the plan's layout checks (``plan.check.check_layout``:
    stages in order covering the blocks once, embedding first, head last, shares summing to
    the micro-batch, schedule and batch consistent, no device twice), then what a launcher
    adds: each replica inside one node, node names that can be file names and arguments."""
    from planner.plan.check import check_layout

    problems = Problems(fmt)
    try:
        check_layout(plan)
    except InputError as exc:           # reported with the launcher's own, in one pass
        for error in exc.errors if isinstance(exc, InputErrors) else [exc]:
            problems.add(str(error))
    for i, stage in enumerate(plan.stages):
        for j, replica in enumerate(stage.replicas):
            nodes = {d.rpartition(":")[0] for d in replica.devices}
            if len(nodes) != 1:
                problems.add(f"stage {i} replica {j} spans nodes {sorted(nodes)}; a replica is "
                             "inside one node")
            for node in sorted(nodes):
                if not _NODE_NAME.match(node):
                    problems.add(f"stage {i} replica {j}: node name {node!r} must be letters, digits, "
                                 "'_', '.', '-' (it becomes a file name and a command argument)")
    problems.raise_if_any()


def odd_tp(stage, tp: int) -> str | None:
    """One line per stage whose replicas do not all have ``tp`` (stage 0 replica 0's), naming
    the first that differs and how many more do; None where they all do.  The caller adds why."""
    odd = [j for j, replica in enumerate(stage.replicas) if replica.tp != tp]
    if not odd:
        return None
    others = f" (and {len(odd) - 1} more of its replicas)" if len(odd) > 1 else ""
    return f"stage {stage.index} replica {odd[0]}{others} has tp {stage.replicas[odd[0]].tp}, stage 0 replica 0 has tp {tp}"


def check_uniform(plan: Plan, fmt: str, tool: str) -> None:
    """Megatron-LM and DeepSpeed: the same data-parallel size and TP everywhere, equal shares."""
    problems = Problems(fmt)
    ref = plan.stages[0]
    ref_tp = ref.replicas[0].tp
    for stage in plan.stages[1:]:
        if len(stage.replicas) != len(ref.replicas):
            problems.add(f"stage {stage.index} has {len(stage.replicas)} replicas, stage 0 has "
                         f"{len(ref.replicas)}: {tool} needs the same data-parallel size on every stage")
    for stage in plan.stages:
        odd = odd_tp(stage, ref_tp)
        if odd:
            problems.add(f"{odd}: {tool} needs the same tensor-parallel size on every replica of every stage")
        shares = [r.micro_batch_share for r in stage.replicas]
        if len(set(shares)) > 1:
            problems.add(f"stage {stage.index} splits each micro-batch unevenly between its replicas "
                         f"(shares {shares}): {tool} gives every data-parallel rank the same "
                         "micro-batch size")
    problems.raise_if_any()


def chunks(plan: Plan, fmt: str) -> list[Chunk]:
    """The model pieces in schedule order.  Without virtual stages a stage is one piece holding
    its blocks.  With ``v`` virtual stages each stage's blocks are cut into ``v`` equal pieces
    dealt round-robin (Megatron-LM's and torch's interleaved layout): piece ``c`` of stage ``s``
    is schedule stage ``c * p + s``; the stage keeps its block count, not its block range."""
    v, p = plan.virtual_stages, plan.num_stages
    if v == 1:
        return [Chunk(s.index, s.index, 0, s.blocks[0], s.blocks[1], s.embedding, s.head)
                for s in plan.stages]
    if plan.schedule in V_SCHEDULES:
        return _v_chunks(plan)
    problems = Problems(fmt)
    for s in plan.stages:
        if s.num_blocks % v:
            problems.add(f"stage {s.index} holds {s.num_blocks} blocks, not a multiple of "
                         f"virtual_stages {v}: interleaving deals each stage {v} equal pieces")
    problems.raise_if_any()
    out: list[Chunk] = []
    first = 0
    for c in range(v):
        for s in plan.stages:
            size = s.num_blocks // v
            out.append(Chunk(c * p + s.index, s.index, c, first, first + size,
                             s.embedding and c == 0, s.head and c == v - 1))
            first += size
    return out


def _v_chunks(plan: Plan) -> list[Chunk]:
    """The V layout of zb-v / dualpipev (torch's ``style="v"`` stage-to-rank map): each stage's
    blocks cut into two equal pieces (plan.check requires an even count), dealt down the ranks
    and back up, so piece ``s`` is rank s's first chunk and piece ``2p - 1 - s`` its second.
    Rank 0 holds the first piece (the embedding) and the last (the head)."""
    p = plan.num_stages
    order = [(s, 0) for s in plan.stages] + [(s, 1) for s in reversed(plan.stages)]
    out: list[Chunk] = []
    first = 0
    for index, (s, c) in enumerate(order):
        size = s.num_blocks // 2
        out.append(Chunk(index, s.index, c, first, first + size, index == 0, index == 2 * p - 1))
        first += size
    return out


# -- spelling -----------------------------------------------------------------------------------
def dump_json(data) -> str:
    """Sorted keys and a final newline: the same plan gives the same bytes."""
    return json.dumps(data, sort_keys=True, indent=2) + "\n"


def shell_join(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def node_script_name(node: NodeSlot) -> str:
    return f"node{node.node_rank}-{node.node}.sh"


def node_script(node: NodeSlot, env: dict[str, str], argv: list[str], comment: list[str]) -> str:
    """A POSIX shell script that runs one node's launcher; ``$DIR`` is the script's folder so
    the generated files are found wherever the folder is copied, and extra arguments given to
    the script are passed on to the training script."""
    lines = ["#!/usr/bin/env bash", (f"# node {node.node}: node rank {node.node_rank}, "
                                     f"{node.nproc} processes. Generated by `planner launch`; do not edit.")]
    lines += [f"# {c}" for c in comment]
    lines += ["set -euo pipefail", 'DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"']
    for key in sorted(env):
        value = env[key]
        # $DIR must expand, so such values are double-quoted; the rest are quoted literally.
        lines.append(f'export {key}="{value}"' if value.startswith("$DIR/") else
                     f"export {key}={shlex.quote(value)}")
    cmd = " \\\n    ".join(" ".join(_quote_keep_dir(a) for a in group) for group in _pairs(argv))
    lines.append(f'exec {cmd} \\\n    "$@"')
    return "\n".join(lines) + "\n"


def _pairs(argv: list[str]) -> list[list[str]]:
    """One line per option with its value, for a script a person can read."""
    groups: list[list[str]] = []
    i = 0
    while i < len(argv):
        if argv[i].startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            groups.append(argv[i:i + 2])
            i += 2
        else:
            groups.append([argv[i]])
            i += 1
    return groups


def _quote_keep_dir(arg: str) -> str:
    return f'"{arg}"' if arg.startswith("$DIR/") else shlex.quote(arg)
