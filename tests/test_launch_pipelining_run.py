"""The generated ``pipelining_setup.py`` really runs under the installed torch: processes on
CPU (gloo) build the groups and schedule from the spec and train one step, and the weighted
per-stage gradient all-reduce over chains with uneven shares gives the gradient of the
whole batch's mean loss, as docs/launch.md claims."""

from __future__ import annotations

import pytest

from planner.launch import render, write
from planner.plan import Plan

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

WIDTH = 8
MODEL = {"name": "tiny", "num_layers": 4, "hidden_size": 16, "num_attention_heads": 2, "vocab_size": 32}


def _piece(piece):
    torch.manual_seed(100 + piece["index"])  # every chain starts a stage from the same weights
    n = piece["blocks"][1] - piece["blocks"][0]
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(n)])


def _loss(out, target):
    return ((out - target) ** 2).mean()


def _worker(rank, world, folders, init_file):
    """One process group for all cases: starting torch in four processes is the slow part."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for folder in folders:
            _one_step(rank, world, folder)
    finally:
        dist.destroy_process_group()


def _one_step(rank, world, folder):
    import importlib.util

    spec_file = importlib.util.spec_from_file_location("setup_" + folder.rsplit("/", 1)[-1].replace("-", "_"),
                                                       f"{folder}/pipelining_setup.py")
    setup = importlib.util.module_from_spec(spec_file)
    spec_file.loader.exec_module(setup)
    spec = setup.load_spec()
    schedule, groups, me = setup.build(_piece, torch.device("cpu"), _loss)
    if spec.get("schedule_csv"):  # the runtime runs exactly the written lists, in order
        assert type(schedule).__name__ == "_PipelineScheduleRuntime"
        with open(f"{folder}/{spec['schedule_csv']}") as fh:
            rows = [line.strip().split(",") for line in fh]
        assert [[str(a) for a in schedule.pipeline_order[r]] for r in range(len(rows))] == rows
    n = spec["n_microbatches"]
    torch.manual_seed(7)
    total = sum(spec["ranks"][str(r)]["micro_batch_share"] for r in range(world)
                if spec["ranks"][str(r)]["stage"] == 0) * n
    x_all, y_all = torch.randn(total, WIDTH), torch.randn(total, WIDTH)
    # Chain r takes its share_r * n rows, chains in replica order.
    chains = sorted({(v["replica"], v["micro_batch_share"]) for v in spec["ranks"].values()})
    start = sum(share * n for r, share in chains if r < me["replica"])
    rows = slice(start, start + me["micro_batch_share"] * n)
    first = 0 in me["pipeline_stages"]
    last = spec["num_pipeline_stages"] - 1 in me["pipeline_stages"]
    args = (x_all[rows],) if first else ()
    schedule.step(*args, target=y_all[rows] if last else None)
    stage_modules = [s.submod for s in schedule._stages] if hasattr(schedule, "_stages") \
        else [schedule._stage.submod]
    for module in stage_modules:
        for p in module.parameters():
            p.grad.mul_(me["dp_grad_weight"])
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=groups["dp"])
    # Reference: the whole model on the whole batch, one process.
    pieces = [_piece(piece) for piece in spec["stages"]]
    _loss(torch.nn.Sequential(*pieces)(x_all), y_all).backward()
    for index, module in zip(me["pipeline_stages"], stage_modules):
        for got, want in zip(module.parameters(), pieces[index].parameters()):
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-6)


def rep(device, share):
    return {"gpu_type": "CPU", "tp": 1, "micro_batch_share": share, "devices": [device]}


def _plan(schedule, v):
    return Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "c", "model": MODEL, "training": {"global_batch_size": 16, "seq_len": 8}},
        "micro_batch_size": 4, "num_micro_batches": 4, "schedule": schedule, "virtual_stages": v,
        "stages": [{"index": 0, "blocks": [0, 2], "embedding": True,
                    "replicas": [rep("n:0", 3), rep("n:1", 1)]},
                   {"index": 1, "blocks": [2, 4], "head": True,
                    "replicas": [rep("n:2", 3), rep("n:3", 1)]}]})


@pytest.mark.slow
def test_generated_setup_trains_one_step(tmp_path):
    folders = []
    for schedule, v in (("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2), ("zb-h1", 1)):
        folder = tmp_path / schedule
        write(render(_plan(schedule, v), "pipelining", master_addr="127.0.0.1"), folder)
        folders.append(str(folder))
    torch.multiprocessing.spawn(_worker, args=(4, folders, str(tmp_path / "init")), nprocs=4)


@pytest.mark.slow
def test_generated_setup_trains_v_schedules(tmp_path):
    # ZB-V and DualPipeV: each rank builds pipeline stages r and 2p-1-r (the V), so rank 0 of
    # each chain feeds the inputs and computes the loss; m = 4 is DualPipeV's minimum for two
    # ranks.  Gradients after the weighted DP all-reduce equal the single-process reference.
    folders = []
    for schedule in ("zb-v", "dualpipev"):
        plan = _plan(schedule, 2)
        files = render(plan, "pipelining", master_addr="127.0.0.1")
        spec = __import__("json").loads(files["pipelining.json"])
        assert {r["stage"]: r["pipeline_stages"] for r in spec["ranks"].values()} == {0: [0, 3], 1: [1, 2]}
        folder = tmp_path / schedule
        write(files, folder)
        folders.append(str(folder))
    torch.multiprocessing.spawn(_worker, args=(4, folders, str(tmp_path / "init")), nprocs=4)


@pytest.mark.slow
def test_action_csv_trains_one_step(tmp_path):
    """--schedule-csv: the same plans run from their per-rank action lists through torch's
    _PipelineScheduleRuntime._load_csv (zb-h1's generated I / W lists, 1f1b's F / B) and match
    the single-process gradients."""
    folders = []
    for schedule in ("zb-h1", "1f1b"):
        folder = tmp_path / f"csv-{schedule}"
        files = render(_plan(schedule, 1), "pipelining", master_addr="127.0.0.1", schedule_csv=True)
        assert "pipeline_schedule.csv" in files
        write(files, folder)
        folders.append(str(folder))
    torch.multiprocessing.spawn(_worker, args=(4, folders, str(tmp_path / "init")), nprocs=4)
