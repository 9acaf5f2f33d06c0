"""``planner launch``: each format on a Megatron-style plan (2 nodes x 4 GPUs, tp 2, pp 2,
dp 2), with the exact arguments, checked against the launchers' own rules where they are at
hand (torch's torchrun parser, Megatron-LM's layout grammar, DeepSpeed's partition hook)."""

from __future__ import annotations

import json
import re
import shlex
import sys
import types

import pytest

from planner.launch import FORMATS, render
from planner.plan import Plan
from planner.spec import cluster_from_dict

MODEL = {"name": "m", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
         "num_kv_heads": 4, "ffn_hidden_size": 2816, "mlp": "swiglu", "vocab_size": 32000,
         "tied_embeddings": False}


def rep(devices, share=2, gpu="A100-SXM4-80GB"):
    return {"gpu_type": gpu, "tp": len(devices), "micro_batch_share": share, "devices": list(devices)}


def make_plan(stages=None, blocks=((0, 3), (3, 8)), **knobs) -> Plan:
    """Stage 0 on node a, stage 1 on node b, two tp-2 replicas each (unless given)."""
    if stages is None:
        stages = [[rep(["a:0", "a:1"]), rep(["a:2", "a:3"])],
                  [rep(["b:0", "b:1"]), rep(["b:2", "b:3"])]]
    micro = sum(r["micro_batch_share"] for r in stages[0])
    count = knobs.get("num_micro_batches", 16)
    data = {
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "t", "model": MODEL,
                   "training": {"global_batch_size": micro * count, "seq_len": 2048, "precision": "bf16"}},
        "micro_batch_size": micro, "num_micro_batches": count, "schedule": "1f1b",
        "recompute": "full", "zero_stage": 1, "sequence_parallel": True,
        "stages": [{"index": i, "blocks": list(blocks[i]), "embedding": i == 0,
                    "head": i == len(stages) - 1, "replicas": reps} for i, reps in enumerate(stages)],
    }
    data.update(knobs)
    return Plan.from_json(data)


def chain_plan(**knobs) -> Plan:
    """Replica chain r on node r: stage 0 and stage 1 of replica 0 both on node a."""
    return make_plan([[rep(["a:2", "a:3"]), rep(["b:0", "b:1"])],
                      [rep(["a:0", "a:1"]), rep(["b:2", "b:3"])]], **knobs)


def script_argv(text: str) -> list[str]:
    """The command a node script execs, as argv (``"$@"`` dropped)."""
    body = text.split("\nexec ", 1)[1].replace("\\\n", " ")
    argv = shlex.split(body)
    assert argv[-1] == "$@"
    return argv[:-1]


def script_env(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key] = shlex.split(value)[0]
    return env


def megatron_args(files) -> list[str]:
    return json.loads(files["megatron_args.json"])["args"]


# -- torchrun -----------------------------------------------------------------------------------
def test_torchrun_commands_parse_with_torchs_own_parser():
    run = pytest.importorskip("torch.distributed.run")
    files = render(make_plan(), "torchrun", master_addr="10.0.0.1", master_port=29400)
    assert sorted(files) == ["node0-a.sh", "node1-b.sh", "rank_map.json"]
    for node_rank, name in enumerate(["node0-a.sh", "node1-b.sh"]):
        argv = script_argv(files[name])
        assert argv == ["torchrun", "--nnodes", "2", "--nproc-per-node", "4", "--node-rank",
                        str(node_rank), "--master-addr", "10.0.0.1", "--master-port", "29400",
                        "train.py"]
        args = run.get_args_parser().parse_args(argv[1:])
        assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("2", "4", node_rank)
        assert (args.master_addr, args.master_port) == ("10.0.0.1", 29400)
        assert args.rdzv_backend == "static" and args.training_script == "train.py"
        assert run.get_rdzv_endpoint(args) == "10.0.0.1:29400"
        config, _, _ = run.config_from_args(args)
        assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (2, 2, 4)
        assert config.rdzv_configs["rank"] == node_rank


def test_torchrun_nodes_may_run_different_process_counts():
    run = pytest.importorskip("torch.distributed.run")
    plan = make_plan([[rep(["a:0", "a:1"], 1), rep(["a:2", "a:3"], 1)], [rep(["b:6", "b:7"], 2)]])
    files = render(plan, "torchrun", master_addr="h")
    args = run.get_args_parser().parse_args(script_argv(files["node1-b.sh"])[1:])
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("2", "2", 1)
    data = json.loads(files["rank_map.json"])
    assert [(r["rank"], r["device"], r["local_rank"]) for r in data["ranks"][4:]] == [(4, "b:6", 0), (5, "b:7", 1)]
    assert script_env(files["node1-b.sh"])["CUDA_VISIBLE_DEVICES"] == "6,7"


def test_torchrun_rank_map_is_the_plans():
    plan = make_plan()
    data = json.loads(render(plan, "torchrun", master_addr="h")["rank_map.json"])
    assert data["world_size"] == 8 and data["master_port"] == 29500
    got = [(r["rank"], r["node"], r["local_rank"], r["device"], r["stage"], r["replica"], r["tp_rank"])
           for r in data["ranks"]]
    assert got == [(0, "a", 0, "a:0", 0, 0, 0), (1, "a", 1, "a:1", 0, 0, 1),
                   (2, "a", 2, "a:2", 0, 1, 0), (3, "a", 3, "a:3", 0, 1, 1),
                   (4, "b", 0, "b:0", 1, 0, 0), (5, "b", 1, "b:1", 1, 0, 1),
                   (6, "b", 2, "b:2", 1, 1, 0), (7, "b", 3, "b:3", 1, 1, 1)]
    assert [n["cuda_visible_devices"] for n in data["nodes"]] == [None, None]


def test_torchrun_rank_map_matches_shared_rankmap_and_plan_launch():
    from planner.launch.ranks import derive_launch
    from planner.plan.rankmap import build_launch

    cluster = cluster_from_dict({"name": "t", "nodes": [
        {"name": "a", "gpu": "A100-SXM4-80GB", "gpus_per_node": 8, "network_bandwidth": "100 Gbit/s"},
        {"name": "b", "gpu": "A100-SXM4-80GB", "gpus_per_node": 4, "network_bandwidth": "100 Gbit/s"}]})
    plan = chain_plan()
    assert derive_launch(plan) == build_launch(cluster, plan)
    with_launch = Plan.from_json({**plan.to_json(), "launch": build_launch(cluster, plan).model_dump()})
    plain = render(plan, "torchrun", master_addr="h")
    assert render(with_launch, "torchrun", master_addr="h") == plain
    # With the cluster, node a (8 GPUs, 4 used) is pinned to its four; b uses all of its GPUs.
    env_a = script_env(render(plan, "torchrun", master_addr="h", cluster=cluster)["node0-a.sh"])
    assert env_a["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert "CUDA_VISIBLE_DEVICES" not in script_env(plain["node0-a.sh"])


def test_torchrun_pins_a_subset_of_gpus():
    plan = make_plan([[rep(["a:4", "a:5"]), rep(["a:6", "a:7"])], [rep(["b:0", "b:1"]), rep(["b:2", "b:3"])]])
    files = render(plan, "torchrun", master_addr="h")
    assert script_env(files["node0-a.sh"])["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert script_env(files["node0-a.sh"])["PLANNER_RANK_MAP"] == "$DIR/rank_map.json"
    assert "CUDA_VISIBLE_DEVICES" not in script_env(files["node1-b.sh"])


# -- Megatron-LM --------------------------------------------------------------------------------
def test_megatron_exact_arguments():
    files = render(make_plan(), "megatron", master_addr="10.0.0.1")
    assert megatron_args(files) == [
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--pipeline-model-parallel-layout", "Et*3|t*5L",
        "--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16",
        "--group-query-attention", "--num-query-groups", "4", "--ffn-hidden-size", "2816",
        "--swiglu", "--seq-length", "2048", "--max-position-embeddings", "2048",
        "--untie-embeddings-and-output-weights",
        "--micro-batch-size", "2", "--global-batch-size", "64",
        "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
        "--sequence-parallel", "--use-distributed-optimizer", "--bf16"]
    argv = script_argv(files["node1-b.sh"])
    assert argv[:12] == ["torchrun", "--nnodes", "2", "--nproc-per-node", "4", "--node-rank", "1",
                         "--master-addr", "10.0.0.1", "--master-port", "29500", "pretrain_gpt.py"]
    assert argv[12:] == megatron_args(files)
    assert script_env(files["node1-b.sh"])["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_megatron_even_split_and_interleaving():
    even = make_plan(blocks=((0, 4), (4, 8)), recompute="selective", zero_stage=0,
                     sequence_parallel=False, inputs={"cluster": "t", "model": {**MODEL, "tied_embeddings": True},
                                                      "training": {"global_batch_size": 64, "seq_len": 1024,
                                                                   "precision": "fp16"}})
    args = megatron_args(render(even, "megatron", master_addr="h"))
    assert "--pipeline-model-parallel-layout" not in args and "--use-distributed-optimizer" not in args
    assert "--untie-embeddings-and-output-weights" not in args and "--sequence-parallel" not in args
    assert args[-3:] == ["--recompute-granularity", "selective", "--fp16"]
    inter = make_plan(blocks=((0, 4), (4, 8)), schedule="interleaved-1f1b", virtual_stages=2)
    args = megatron_args(render(inter, "megatron", master_addr="h"))
    assert args[4:6] == ["--num-layers-per-virtual-pipeline-stage", "2"]
    uneven = make_plan(blocks=((0, 2), (2, 8)), schedule="interleaved-1f1b", virtual_stages=2)
    args = megatron_args(render(uneven, "megatron", master_addr="h"))
    assert args[4:6] == ["--pipeline-model-parallel-layout", "Et|t*3|t|t*3L"]


def parse_megatron_layout(layout: str, pp: int) -> list[list[str]]:
    """Megatron-LM's grammar (pipeline_parallel_layer_layout.py, parse_str_to_list) restated."""
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    stages = [list(s) for s in text.split("|")]
    assert len(stages) % pp == 0 and all(c in "EtLm" for s in stages for c in s)
    return stages


@pytest.mark.parametrize("blocks,v", [(((0, 3), (3, 8)), 1), (((0, 2), (2, 8)), 2), (((0, 6), (6, 8)), 2)])
def test_megatron_layout_satisfies_megatrons_rules(blocks, v):
    plan = make_plan(blocks=blocks, schedule="interleaved-1f1b" if v > 1 else "1f1b", virtual_stages=v)
    args = megatron_args(render(plan, "megatron", master_addr="h"))
    stages = parse_megatron_layout(args[args.index("--pipeline-model-parallel-layout") + 1], 2)
    flat = [c for s in stages for c in s]  # already virtual-chunk-major = layer order
    assert flat[0] == "E" and flat[-1] == "L" and flat.count("t") == 8
    # Physical stage s holds its plan block count across its virtual chunks.
    for s, (first, last) in enumerate(blocks):
        assert sum(stages[c * 2 + s].count("t") for c in range(v)) == last - first


def test_megatron_rank_map_follows_megatrons_numbering():
    for plan, flag in ((make_plan(), False), (chain_plan(), True)):
        files = render(plan, "megatron", master_addr="h")
        assert ("--use-tp-pp-dp-mapping" in megatron_args(files)) is flag
        data = json.loads(files["rank_map.json"])
        tp, dp, pp = 2, 2, 2
        for r in data["ranks"]:
            rank = r["rank"]
            if flag:  # tp-cp-ep-pp-dp: tensor fastest, then pipeline, then data
                want = (rank // (tp * pp), (rank // tp) % pp, rank % tp)
            else:  # tp-cp-ep-dp-pp
                want = ((rank // tp) % dp, rank // (tp * dp), rank % tp)
            assert (r["replica"], r["stage"], r["tp_rank"]) == want
            assert r["device"] == plan.stages[r["stage"]].replicas[r["replica"]].devices[r["tp_rank"]]
        # Local rank i of a node must land on that rank's device through CUDA_VISIBLE_DEVICES.
        for node in data["nodes"]:
            ranks = [r for r in data["ranks"] if r["node"] == node["node"]]
            visible = node["cuda_visible_devices"]
            order = visible.split(",") if visible else [str(i) for i in range(len(ranks))]
            assert [r["device"] for r in ranks] == [f"{node['node']}:{i}" for i in order]
    chain = json.loads(render(chain_plan(), "megatron", master_addr="h")["rank_map.json"])
    assert chain["nodes"][0]["cuda_visible_devices"] == "2,3,0,1"
    assert chain["rank_order"] == "tp-pp-dp"


# -- DeepSpeed ----------------------------------------------------------------------------------
def test_deepspeed_config_and_boundaries():
    files = render(make_plan(), "deepspeed", master_addr="h")
    assert sorted(files) == ["deepspeed_pipeline.json", "ds_config.json", "node0-a.sh", "node1-b.sh",
                             "pipeline_module.py", "rank_map.json"]
    config = json.loads(files["ds_config.json"])
    assert config == {
        "train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 16,
        "bf16": {"enabled": True}, "fp16": {"enabled": False}, "zero_optimization": {"stage": 1},
        "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False,
                                     "contiguous_memory_optimization": False,
                                     "synchronize_checkpoint_boundary": False, "profile": False}}
    # DeepSpeed's own identity: batch = micro batch x accumulation x data-parallel ranks.
    assert config["train_batch_size"] == 2 * 16 * 2
    spec = json.loads(files["deepspeed_pipeline.json"])
    assert spec["num_stages"] == 2 and spec["parts"] == [0, 4, 10]
    assert spec["topology"] == {"axes": ["pipe", "data", "model"], "dims": [2, 2, 2]}
    assert spec["activation_checkpoint_interval"] == 1
    assert script_argv(files["node0-a.sh"])[-2:] == ["--deepspeed_config", "$DIR/ds_config.json"]
    chain = json.loads(render(chain_plan(), "deepspeed", master_addr="h")["deepspeed_pipeline.json"])
    assert chain["topology"]["axes"] == ["data", "pipe", "model"]


def _fake_deepspeed(monkeypatch):
    """Just enough of deepspeed for the generated module: ProcessTopology's row-major numbering
    and PipelineModule.__init__ calling _partition_layers (module.py, as checked)."""
    from collections import namedtuple
    from itertools import product

    class ProcessTopology:
        def __init__(self, axes, dims):
            self.axes, self.dims = axes, dims
            coord = namedtuple("ProcessCoord", axes)
            self.coords = [coord(*c) for c in product(*(range(d) for d in dims))]

        def get_dim(self, axis):
            return self.dims[self.axes.index(axis)] if axis in self.axes else 0

        def get_coord(self, rank):
            return self.coords[rank]

    class PipelineModule:
        def __init__(self, layers, topology=None, partition_method="parameters",
                     activation_checkpoint_interval=0, global_rank=0):
            if partition_method not in ("uniform", "parameters") and not partition_method.startswith("type:"):
                raise NotImplementedError(partition_method)
            self._topo, self.global_rank = topology, global_rank
            self._layer_specs = list(layers)
            self.activation_checkpoint_interval = activation_checkpoint_interval
            self._partition_layers(method=partition_method)

        def _set_bounds(self, start=None, stop=None):
            self._local_start, self._local_stop = start, stop

    pipe = types.ModuleType("deepspeed.pipe")
    pipe.PipelineModule = PipelineModule
    topo = types.ModuleType("deepspeed.runtime.pipe.topology")
    topo.ProcessTopology = ProcessTopology
    for name, module in {"deepspeed": types.ModuleType("deepspeed"), "deepspeed.pipe": pipe,
                         "deepspeed.runtime": types.ModuleType("deepspeed.runtime"),
                         "deepspeed.runtime.pipe": types.ModuleType("deepspeed.runtime.pipe"),
                         "deepspeed.runtime.pipe.topology": topo}.items():
        monkeypatch.setitem(sys.modules, name, module)


def test_deepspeed_module_builds_the_plans_stages(monkeypatch):
    _fake_deepspeed(monkeypatch)
    for plan in (make_plan(), chain_plan()):
        files = render(plan, "deepspeed", master_addr="h")
        namespace: dict = {}
        # Our own generated module, run against the stand-in above.
        exec(compile(files["pipeline_module.py"], "pipeline_module.py", "exec"), namespace)  # noqa: S102
        ranks = json.loads(files["rank_map.json"])["ranks"]
        layers = ["embedding"] + [f"block_{i}" for i in range(8)] + ["head"]
        for r in ranks:
            module = namespace["PlannedPipelineModule"](layers, global_rank=r["rank"])
            first, last = plan.stages[r["stage"]].blocks
            built = layers[module._local_start:module._local_stop]
            want = (["embedding"] if r["stage"] == 0 else []) + [f"block_{i}" for i in range(first, last)] \
                + (["head"] if r["stage"] == 1 else [])
            assert built == want
            coord = module._topo.get_coord(r["rank"])
            assert (coord.pipe, coord.data, coord.model) == (r["stage"], r["replica"], r["tp_rank"])
            assert module.activation_checkpoint_interval == 1


# -- torch.distributed.pipelining ---------------------------------------------------------------
def test_pipelining_spec():
    data = json.loads(render(make_plan(), "pipelining", master_addr="h")["pipelining.json"])
    assert data["schedule_class"] == "Schedule1F1B" and data["n_microbatches"] == 16
    assert data["num_pipeline_stages"] == 2
    assert data["stages"] == [
        {"index": 0, "stage": 0, "virtual_chunk": 0, "blocks": [0, 3], "embedding": True, "head": False},
        {"index": 1, "stage": 1, "virtual_chunk": 0, "blocks": [3, 8], "embedding": False, "head": True}]
    assert data["groups"] == {"pp": [[0, 4], [1, 5], [2, 6], [3, 7]],
                              "dp": [[0, 2], [1, 3], [4, 6], [5, 7]],
                              "tp": [[0, 1], [2, 3], [4, 5], [6, 7]]}
    assert data["ranks"]["5"] == {"stage": 1, "replica": 0, "tp_rank": 1, "device": "b:1",
                                  "pipeline_stages": [1], "pp_group": 1, "dp_group": 3, "tp_group": 2,
                                  "micro_batch_share": 2, "dp_grad_weight": 0.5}


def test_pipelining_interleaved_and_uneven_chain_shares():
    plan = make_plan([[rep(["a:0", "a:1"], 3), rep(["a:2", "a:3"], 1)],
                      [rep(["b:0", "b:1"], 3), rep(["b:2", "b:3"], 1)]],
                     blocks=((0, 4), (4, 8)), schedule="interleaved-1f1b", virtual_stages=2)
    data = json.loads(render(plan, "pipelining", master_addr="h")["pipelining.json"])
    assert data["schedule_class"] == "ScheduleInterleaved1F1B" and data["num_pipeline_stages"] == 4
    assert [s["blocks"] for s in data["stages"]] == [[0, 2], [2, 4], [4, 6], [6, 8]]
    assert data["ranks"]["0"]["pipeline_stages"] == [0, 2]
    assert data["ranks"]["4"]["pipeline_stages"] == [1, 3]
    assert [data["ranks"][str(r)]["dp_grad_weight"] for r in (0, 2)] == [0.75, 0.25]


def test_pipelining_zb_h1():
    plan = make_plan(blocks=((0, 4), (4, 8)), schedule="zb-h1")
    files = render(plan, "pipelining", master_addr="h")
    data = json.loads(files["pipelining.json"])
    assert data["schedule_class"] == "ScheduleInterleavedZeroBubble" and data["num_pipeline_stages"] == 2
    assert any(n.startswith("zb-h1: ScheduleInterleavedZeroBubble with one stage per rank") for n in data["notes"])
    assert "ScheduleInterleavedZeroBubble" in files["pipelining_setup.py"]
    assert "ScheduleInterleavedZeroBubble" in files[next(f for f in files if f.endswith(".sh"))]
    # torchrun passes the schedule through as it is
    assert json.loads(render(plan, "torchrun", master_addr="h")["rank_map.json"])["schedule"] == "zb-h1"


@pytest.mark.parametrize("schedule,cls", [("zb-v", "ScheduleZBVZeroBubble"), ("dualpipev", "ScheduleDualPipeV")])
def test_pipelining_v_schedules(schedule, cls):
    # stages of 2 and 6 blocks: pieces of 1, 3 | 3, 1 dealt down and back: rank 0 holds
    # pieces 0 and 3 (the embedding and the head), rank 1 pieces 1 and 2
    plan = make_plan(blocks=((0, 2), (2, 8)), schedule=schedule, virtual_stages=2)
    files = render(plan, "pipelining", master_addr="h")
    data = json.loads(files["pipelining.json"])
    assert data["schedule_class"] == cls and data["num_pipeline_stages"] == 4
    assert [s["blocks"] for s in data["stages"]] == [[0, 1], [1, 4], [4, 7], [7, 8]]
    assert [(s["embedding"], s["head"]) for s in data["stages"]] == [(True, False), (False, False),
                                                                    (False, False), (False, True)]
    ranks = {r["stage"]: r["pipeline_stages"] for r in data["ranks"].values()}
    assert ranks == {0: [0, 3], 1: [1, 2]}
    assert any(n.startswith(f"{schedule}: {cls} with two stages per rank in a V") for n in data["notes"])
    assert cls in files["pipelining_setup.py"]


def test_pipelining_names_exist_in_installed_torch():
    pipelining = pytest.importorskip("torch.distributed.pipelining")
    import inspect

    for fmt_schedule in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev"):
        plan = make_plan(blocks=((0, 4), (4, 8)), schedule=fmt_schedule,
                         virtual_stages=1 if fmt_schedule in ("gpipe", "1f1b", "zb-h1") else 2)
        files = render(plan, "pipelining", master_addr="h")
        assert hasattr(pipelining, json.loads(files["pipelining.json"])["schedule_class"])
        compile(files["pipelining_setup.py"], "pipelining_setup.py", "exec")
    params = inspect.signature(pipelining.PipelineStage).parameters
    zb = inspect.signature(pipelining.ScheduleInterleavedZeroBubble).parameters
    assert list(zb)[:3] == ["stages", "n_microbatches", "loss_fn"]  # a list of stages, as the snippet passes
    assert list(params)[:4] == ["submodule", "stage_index", "num_stages", "device"] and "group" in params


# -- all formats --------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_same_plan_same_bytes(fmt):
    plan = make_plan()
    again = Plan.from_json(json.loads(plan.dumps()))
    assert render(plan, fmt, master_addr="h") == render(again, fmt, master_addr="h")
    assert all(text.endswith("\n") for text in render(plan, fmt, master_addr="h").values())


# -- precision ----------------------------------------------------------------------------------
def with_precision(prec: str, gpu: str = "A100-SXM4-80GB") -> Plan:
    stages = [[rep(["a:0", "a:1"], gpu=gpu), rep(["a:2", "a:3"], gpu=gpu)],
              [rep(["b:0", "b:1"], gpu=gpu), rep(["b:2", "b:3"], gpu=gpu)]]
    return make_plan(stages, inputs={"cluster": "t", "model": MODEL, "training": {
        "global_batch_size": 64, "seq_len": 2048, "precision": prec}})


@pytest.mark.parametrize("prec", ["fp32", "tf32"])
def test_megatron_fp32_and_tf32_pass_neither_fp16_nor_bf16(prec):
    files = render(with_precision(prec), "megatron", master_addr="h")
    args = megatron_args(files)
    assert "--fp16" not in args and "--bf16" not in args
    assert args[-1] == "--use-distributed-optimizer"
    notes = json.loads(files["megatron_args.json"])["notes"]
    assert any("neither --fp16 nor --bf16" in n for n in notes)
    env = script_env(files["node0-a.sh"])
    if prec == "tf32":   # PyTorch's allow_tf32 switch, forced on from outside the script
        assert env["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "1"
        assert "allow_tf32 = True" in files["node0-a.sh"]
    else:                # plain fp32: PyTorch's default, nothing to set; TE's TF32 GEMMs noted
        assert "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE" not in env
        assert any("--transformer-impl local" in n for n in notes)
    assert "NVIDIA_TF32_OVERRIDE" not in files["node0-a.sh"]   # that one can only turn TF32 off


@pytest.mark.parametrize("prec", ["fp32", "tf32"])
def test_deepspeed_fp32_and_tf32_have_no_fp16_or_bf16_section(prec):
    files = render(with_precision(prec), "deepspeed", master_addr="h")
    config = json.loads(files["ds_config.json"])
    assert "fp16" not in config and "bf16" not in config
    assert config["zero_optimization"] == {"stage": 1}
    assert ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE" in script_env(files["node1-b.sh"])) == (prec == "tf32")
    assert any(prec in n for n in json.loads(files["deepspeed_pipeline.json"])["notes"])


def test_mixed_precision_launch_files_are_as_before():
    fp16 = json.loads(render(with_precision("fp16"), "deepspeed", master_addr="h")["ds_config.json"])
    assert fp16["fp16"] == {"enabled": True} and fp16["bf16"] == {"enabled": False}
    assert megatron_args(render(with_precision("fp16"), "megatron", master_addr="h"))[-1] == "--fp16"
    for fmt in sorted(FORMATS):
        files = render(with_precision("bf16"), fmt, master_addr="h")
        assert "TF32" not in "".join(files[name] for name in files if name.endswith(".sh"))


@pytest.mark.parametrize("fmt", ["torchrun", "pipelining"])
def test_tf32_plans_export_the_tf32_switch_and_the_rank_map_names_the_precision(fmt):
    files = render(with_precision("tf32"), fmt, master_addr="h")
    assert json.loads(files["rank_map.json"])["precision"] == "tf32"
    env = script_env(files["node0-a.sh"])
    assert env["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "1" and "HIPBLASLT_ALLOW_TF32" not in env
    fp32 = render(with_precision("fp32"), fmt, master_addr="h")
    assert json.loads(fp32["rank_map.json"])["precision"] == "fp32"
    assert "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE" not in script_env(fp32["node0-a.sh"])
    # ROCm's PyTorch also wants its own switch before it uses TF32 (MI300X)
    amd = render(with_precision("tf32", gpu="MI300X-192GB"), fmt, master_addr="h")
    assert script_env(amd["node0-a.sh"])["HIPBLASLT_ALLOW_TF32"] == "1"
