"""Reading plan files and checking a plan against its cluster and model.

Pydantic checks each field's own form (``planner.plan.model``); this module checks what
needs the cluster, the model or several fields at once, and reports every problem it finds
in one pass, each naming the plan file and the field path (``stages[1].replicas[0].devices[2]``).
JSON keeps no per-field positions, so errors give the path rather than a line.
"""

from __future__ import annotations

import json
from pathlib import Path

from planner import catalog
from planner.errors import InputError, InputErrors, Location
from planner.plan.model import SCHEMA_ID, V_SCHEDULES, Plan
from planner.spec.cluster import Cluster
from planner.spec.model import ModelSpec
from planner.spec.source import PathKey, document_from_data, format_field_path, read_text, validate_model
from planner.spec.training import PLAN_ABSENT_KERNELS, Training


def load_plan(path: str | Path) -> Plan:
    """Read a plan JSON file; bad JSON, a foreign schema or bad fields become InputError."""
    file = str(path)
    text = read_text(path, "plan file")
    duplicates: list[str] = []

    def no_duplicates(pairs):
        # json keeps the last of repeated keys silently; a hand-edited plan deserves a word
        seen: dict = {}
        for key, value in pairs:
            if key in seen:
                duplicates.append(key)
            seen[key] = value
        return seen

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", Location(file, exc.lineno, exc.colno)) from None
    except RecursionError:
        # arrays or objects nested thousands deep overflow the decoder: a bad file, not a bug
        raise InputError("nested too deeply to be a plan (arrays and objects inside each other "
                         "thousands of times)", Location(file, 1)) from None
    if duplicates:
        raise InputError(f"duplicate key(s) in a JSON object: {', '.join(sorted(set(duplicates)))}; "
                         "each key may appear once per object", Location(file, 1))
    return plan_from_data(data, file)


def plan_from_data(data, file: str = "<plan>") -> Plan:
    """A ``Plan`` from already-parsed JSON, with the same errors as ``load_plan``."""
    if not isinstance(data, dict):
        raise InputError(f"a plan is a JSON object with \"schema\": \"{SCHEMA_ID}\", inputs, "
                         "micro_batch_size, num_micro_batches and stages", Location(file, 1))
    schema = data.get("schema")
    if schema != SCHEMA_ID:
        what = "has no \"schema\" field" if schema is None else f"has schema {schema!r}"
        raise InputError(f"the plan {what}; this planner reads \"{SCHEMA_ID}\"",
                         Location(file, field="schema"))
    return validate_model(Plan, document_from_data(data, file))


class _Report:
    def __init__(self, file: str):
        self.file = file
        self.errors: list[InputError] = []

    def add(self, path: PathKey, message: str) -> None:
        self.errors.append(InputError(message, Location(self.file, field=format_field_path(path) or None)))


def _resolve_model(plan: Plan, model, report: _Report) -> ModelSpec | None:
    from planner.spec.load import load_model  # the loader pulls in the catalog; keep it lazy

    source = model if model is not None else plan.inputs.model
    try:
        return load_model(source)
    except InputErrors as exc:  # before InputError: it is a subclass
        for err in exc.errors:
            sub = err.location.field if err.location and err.location.field else ""
            report.add(("inputs", "model") + ((sub,) if sub else ()), err.message)
    except InputError as exc:
        report.add(("inputs", "model"), f"cannot read the model: {exc.message}")
    return None


def _gpu_matches(name: str, node_gpu: str) -> bool:
    if name.strip().lower() == node_gpu.strip().lower():
        return True
    found = catalog.find_gpu(name)
    return found is not None and found.name == node_gpu


def _check_devices(cluster: Cluster, plan: Plan, report: _Report, precision: str | None) -> None:
    nodes = cluster.node_by_name
    node_names = ", ".join(f"{n.name} ({n.gpus_per_node}x {n.gpu.name})" for n in cluster.node_list[:12])
    if len(cluster.node_list) > 12:
        node_names += f", ... {len(cluster.node_list) - 12} more"
    first_use: dict[str, str] = {}
    for i, stage in enumerate(plan.stages):
        for j, rep in enumerate(stage.replicas):
            rep_path = ("stages", i, "replicas", j)
            rep_nodes: list[str] = []
            for k, dev in enumerate(rep.devices):
                path = rep_path + ("devices", k)
                name, _, idx = dev.rpartition(":")
                node = nodes.get(name)
                if node is None:
                    report.add(path, f"unknown device {dev!r}: cluster {cluster.name!r} has no node "
                                     f"{name!r}; nodes: {node_names}")
                    continue
                if int(idx) >= node.gpus_per_node:
                    report.add(path, f"unknown device {dev!r}: node {name!r} has GPUs "
                                     f"0..{node.gpus_per_node - 1}")
                    continue
                where = format_field_path(path)
                if dev in first_use:
                    report.add(path, f"device {dev!r} is used twice (also at {first_use[dev]})")
                else:
                    first_use[dev] = where
                if name not in rep_nodes:
                    rep_nodes.append(name)
            if len(rep_nodes) > 1:
                report.add(rep_path + ("devices",), f"a replica lives inside one node, but these "
                                                    f"devices span {', '.join(rep_nodes)}")
            if rep_nodes:
                gpu = nodes[rep_nodes[0]].gpu
                if not _gpu_matches(rep.gpu_type, gpu.name):
                    report.add(rep_path + ("gpu_type",), f"gpu_type {rep.gpu_type!r} does not match "
                                                         f"node {rep_nodes[0]!r}, which holds {gpu.name}")
                elif precision == "bf16" and not gpu.supports_bf16:
                    report.add(rep_path + ("gpu_type",), f"{gpu.name} has no bf16, but "
                               "inputs.training.precision is bf16; use fp16 (or fp32, tf32) or "
                               "another GPU type")


def _check_stages(plan: Plan, model: ModelSpec | None, report: _Report) -> None:
    p = len(plan.stages)
    for i, stage in enumerate(plan.stages):
        if stage.index != i:
            report.add(("stages", i, "index"), f"stage indices must be 0..{p - 1} in order; "
                                               f"position {i} has index {stage.index}")
        want_first = 0 if i == 0 else plan.stages[i - 1].blocks[1]
        if stage.blocks[0] != want_first:
            report.add(("stages", i, "blocks"),
                       f"blocks must be contiguous: stage {i} should start at block {want_first}, "
                       f"not {stage.blocks[0]}")
        if stage.num_blocks == 0 and not stage.embedding and not stage.head:
            report.add(("stages", i, "blocks"), "the stage holds no blocks, embedding or head")
        if stage.embedding != (i == 0):
            report.add(("stages", i, "embedding"), "the embedding belongs to stage 0 only"
                       if i else "stage 0 must hold the embedding (\"embedding\": true)")
        if stage.head != (i == p - 1):
            report.add(("stages", i, "head"), f"the head belongs to the last stage ({p - 1}) only"
                       if i != p - 1 else "the last stage must hold the head (\"head\": true)")
        shares = sum(r.micro_batch_share for r in stage.replicas)
        if shares != plan.micro_batch_size:
            report.add(("stages", i, "replicas"),
                       f"micro_batch_share of the replicas sums to {shares}, but micro_batch_size "
                       f"is {plan.micro_batch_size}; every stage splits each micro-batch whole")
        if model is not None:
            for j, rep in enumerate(stage.replicas):
                for what, heads in (("num_attention_heads", model.num_attention_heads),
                                    ("num_kv_heads", model.kv_heads)):
                    if heads % rep.tp:
                        report.add(("stages", i, "replicas", j, "tp"),
                                   f"tp={rep.tp} must divide the model's {what} ({heads}); "
                                   f"valid: {', '.join(str(d) for d in _divisors(heads))}")
                        break
    _check_expert_parallel(plan, model, report)
    if model is not None and plan.stages[-1].blocks[1] != model.num_layers:
        report.add(("stages", p - 1, "blocks"),
                   f"the stages must cover blocks [0, {model.num_layers}) of {model.name}; "
                   f"they end at {plan.stages[-1].blocks[1]}")


def _check_expert_parallel(plan: Plan, model: ModelSpec | None, report: _Report) -> None:
    """ep replicas of a stage split the experts (planner.cost.moe): a MoE model, ep dividing
    its experts and every stage's replica count."""
    ep = plan.expert_parallel
    if ep == 1:
        return
    if model is not None and not model.is_moe:
        report.add(("expert_parallel",), f"expert_parallel={ep} needs a Mixture-of-Experts model; "
                                         f"{model.name} has no experts (use 1)")
        return
    if model is not None and model.num_experts % ep:
        report.add(("expert_parallel",),
                   f"expert_parallel={ep} must divide the model's num_experts ({model.num_experts}); "
                   f"valid: {', '.join(str(d) for d in _divisors(model.num_experts))}")
    for i, stage in enumerate(plan.stages):
        if len(stage.replicas) % ep:
            report.add(("stages", i, "replicas"),
                       f"expert_parallel={ep} must divide the stage's replica count "
                       f"({len(stage.replicas)}): its replicas form groups of {ep} that split the experts")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _check_schedule(plan: Plan, report: _Report) -> None:
    v, p = plan.virtual_stages, len(plan.stages)
    if plan.schedule == "interleaved-1f1b":
        if v < 2:
            report.add(("virtual_stages",), "interleaved-1f1b needs virtual_stages >= 2")
            return
        for i, stage in enumerate(plan.stages):
            if stage.num_blocks % v:
                report.add(("stages", i, "blocks"),
                           f"{stage.num_blocks} blocks do not split into virtual_stages={v} equal chunks")
        if plan.num_micro_batches % p:
            # Megatron-LM's interleaved schedule asserts this too.
            report.add(("num_micro_batches",),
                       f"interleaved-1f1b needs num_micro_batches ({plan.num_micro_batches}) to be "
                       f"a multiple of the number of stages ({p})")
    elif plan.schedule in V_SCHEDULES:
        _check_v_schedule(plan, report)
    elif plan.schedule == "bitpipe":
        _check_bitpipe(plan, report)
    elif v != 1 and plan.schedule in ("zb-h1", "latency-aware"):
        # ZB-H1 as torch's ScheduleInterleavedZeroBubble runs it here, and the latency-aware
        # action lists are written for, one stage per rank.
        report.add(("virtual_stages",), f"{plan.schedule} runs one stage per rank: virtual_stages must be 1, not {v}")
    elif v != 1:
        report.add(("virtual_stages",), f"virtual_stages={v} needs schedule \"interleaved-1f1b\" "
                                        f"(or 2 with \"zb-v\" / \"dualpipev\"; the schedule is "
                                        f"{plan.schedule!r}); use 1")


def _check_v_schedule(plan: Plan, report: _Report) -> None:
    """ZB-V and DualPipeV: two chunks per rank in a V, as torch's ScheduleZBVZeroBubble and
    ScheduleDualPipeV require; DualPipeV also torch's micro-batch rule."""
    v, p, name = plan.virtual_stages, len(plan.stages), plan.schedule
    if v != 2:
        report.add(("virtual_stages",), f"{name} runs two chunks per rank in a V: virtual_stages must "
                                        f"be 2, not {v}")
        return
    for i, stage in enumerate(plan.stages):
        if stage.num_blocks % 2:
            report.add(("stages", i, "blocks"), f"{stage.num_blocks} blocks do not split into the two "
                                                f"equal chunks {name} runs per rank; use an even count")
    if name == "dualpipev" and plan.num_micro_batches < 2 * p:
        # torch 2.13 ScheduleDualPipeV.__init__: n_microbatches >= num_stages (= 2 per rank)
        report.add(("num_micro_batches",), f"dualpipev needs num_micro_batches >= 2 x stages = {2 * p} "
                                           f"(torch's ScheduleDualPipeV), got {plan.num_micro_batches}")


def _check_bitpipe(plan: Plan, report: _Report) -> None:
    """BitPipe (planner.simulate.bitpipe): stage r is rank r's share of each pipeline, run as the
    V's two chunks, and rank r also holds rank p-1-r's share (the up pipeline) and all-reduces
    its gradients with rank p-1-r."""
    p, m = len(plan.stages), plan.num_micro_batches
    if plan.virtual_stages != 1:
        report.add(("virtual_stages",), f"bitpipe cuts each stage into its V's two chunks itself: "
                                        f"virtual_stages must be 1, not {plan.virtual_stages}")
    if p < 2 or p % 2:
        report.add(("stages",), f"bitpipe pairs stage r with stage p-1-r (they hold the same weights), "
                                f"so it needs an even number of stages >= 2, not {p}")
    if m < 2 or m % 2:
        report.add(("num_micro_batches",), f"bitpipe sends half of the micro-batches down and half up: "
                                           f"num_micro_batches must be even and >= 2, not {m}")
    for i, stage in enumerate(plan.stages):
        if stage.num_blocks % 2:
            report.add(("stages", i, "blocks"), f"bitpipe runs each stage as two chunks of equal blocks; "
                                                f"{stage.num_blocks} blocks do not split in two")
        j = p - 1 - i
        if i < j and len(stage.replicas) != len(plan.stages[j].replicas):
            report.add(("stages", j, "replicas"),
                       f"bitpipe all-reduces the gradients of stage {i} and stage {j} replica by "
                       f"replica: they need as many replicas ({len(stage.replicas)} against "
                       f"{len(plan.stages[j].replicas)})")


def _check_actions(plan: Plan, report: _Report) -> None:
    """``pipeline_actions``: present exactly for the latency-aware schedule, one list per stage,
    each action well formed, and together a complete schedule that runs to the end."""
    lists = plan.pipeline_actions
    if plan.schedule != "latency-aware":
        if lists is not None:
            report.add(("pipeline_actions",), f"only schedule \"latency-aware\" reads pipeline_actions "
                                              f"(the schedule is {plan.schedule!r}); remove it")
        return
    if lists is None:
        report.add(("pipeline_actions",), "schedule latency-aware needs pipeline_actions: per stage, its "
                                          "ordered actions ('F0.3' = forward of micro-batch 3; I, W the "
                                          "backward's halves, B a whole one); `planner schedule CLUSTER PLAN "
                                          "--latency-aware` writes them")
        return
    from planner.simulate.actions import ScheduleError, validate
    from planner.simulate.latency_plan import parse_action, plan_schedule

    p, m = len(plan.stages), plan.num_micro_batches
    if len(lists) != p:
        report.add(("pipeline_actions",), f"{len(lists)} action lists for {p} stages; one per stage")
        return
    bad = False
    for r, acts in enumerate(lists):
        for i, text in enumerate(acts):
            try:
                a = parse_action(text)
            except ValueError as exc:
                report.add(("pipeline_actions", r, i), str(exc))
                bad = True
                continue
            if a.chunk != 0 or a.micro_batch >= m:
                report.add(("pipeline_actions", r, i),
                           f"{text!r}: one chunk per stage (chunk 0) and micro-batches 0..{m - 1}")
                bad = True
    if bad:
        return
    try:
        validate(plan_schedule(plan))
    except ScheduleError as exc:
        report.add(("pipeline_actions",), f"the action lists are not a complete schedule: {exc} "
                                          "(every stage needs F of each micro-batch once and either its "
                                          "B or its I and W, in an order that can run)")


def plan_training(plan: Plan, file: str = "<plan>") -> Training:
    """The plan's ``inputs.training`` as a validated ``Training`` (errors name the file), a
    kernel choice it leaves out read as the plan was priced (PLAN_ABSENT_KERNELS), not as
    today's default."""
    data = {**PLAN_ABSENT_KERNELS, **(plan.inputs.training or {})}
    return validate_model(Training, document_from_data(data, file), ("inputs", "training"))


def _check_training(plan: Plan, report: _Report) -> None:
    try:
        training = plan_training(plan, report.file)
    except InputErrors as exc:
        report.errors.extend(exc.errors)
        return
    total = plan.micro_batch_size * plan.num_micro_batches
    if total != training.global_batch_size:
        report.add(("num_micro_batches",),
                   f"micro_batch_size * num_micro_batches = {plan.micro_batch_size} * "
                   f"{plan.num_micro_batches} = {total}, but inputs.training.global_batch_size "
                   f"is {training.global_batch_size}")
    cp = plan.context_parallel
    if cp > 1 and training.seq_len % (2 * cp):
        report.add(("context_parallel",),
                   f"context_parallel {cp} splits each sequence into 2 x {cp} = {2 * cp} chunks "
                   f"(two per GPU, balancing causal attention), but inputs.training.seq_len "
                   f"{training.seq_len} is not a multiple of {2 * cp}")


def _check_duplicates(plan: Plan, report: _Report) -> None:
    first_use: dict[str, str] = {}
    for i, stage in enumerate(plan.stages):
        for j, rep in enumerate(stage.replicas):
            for k, dev in enumerate(rep.devices):
                path = ("stages", i, "replicas", j, "devices", k)
                if dev in first_use:
                    report.add(path, f"device {dev!r} is used twice (also at {first_use[dev]})")
                else:
                    first_use[dev] = format_field_path(path)


def check_layout(plan: Plan, model=None, file: str = "<plan>") -> None:
    """The checks that need no cluster (stages, shares, schedule, batch, model, devices used
    once): what a runner on local processes can check.  Raises ``InputErrors``."""
    report = _Report(file)
    resolved = _resolve_model(plan, model, report)
    _check_training(plan, report)
    _check_stages(plan, resolved, report)
    _check_schedule(plan, report)
    _check_actions(plan, report)
    _check_duplicates(plan, report)
    if report.errors:
        raise InputErrors(report.errors)


def check_plan(cluster: Cluster, plan: Plan, model=None, file: str = "<plan>") -> None:
    """Raise ``InputErrors`` listing every way ``plan`` does not fit ``cluster`` and its model.

    ``model``: a ``ModelSpec``, catalog name or mapping; default the plan's ``inputs.model``.
    """
    report = _Report(file)
    resolved = _resolve_model(plan, model, report)
    _check_training(plan, report)
    _check_stages(plan, resolved, report)
    _check_schedule(plan, report)
    _check_actions(plan, report)
    _check_devices(cluster, plan, report, plan.inputs.training.get("precision", "bf16"))
    if report.errors:
        raise InputErrors(report.errors)
