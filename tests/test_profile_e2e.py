"""End-to-end check of measured profiles (docs/profiles.md), as a user runs it: profile the
cpu-small model on this machine now (`planner profile --concurrent 2`: one of 2 processes at
once, one per core of a 2-core machine), map that profile in copies of cluster_specs/cpu-local
and cpu-local-4 (which adds `cores: 2`, so its 4 processes share the cores under processor
sharing), predict a CPU job's step time, run the same plan with the reference runner, compare.
The committed profiles/cpu-small*.yaml are examples measured on one day under one load; a
machine's speed drifts by tens of percent between hours, so the check measures its own.

The plans are built by hand (a few devices need no search); test_profile_cost.py reuses them.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from timing import (
    STEADY_SPREAD,
    probe_spread,
    require_quiet_machine,
    speed_probe_s,
    steady_errors,
    timing_forced,
)

from planner.plan import Plan
from planner.spec import load_model

ROOT = Path(__file__).resolve().parents[1]
MODEL_FILE = ROOT / "profiles" / "models" / "cpu-small.yaml"
PROFILE_FILE = ROOT / "profiles" / "cpu-small.yaml"
SEQ_LEN = 128


def _plan(stages: list[dict], micro_batch_size: int, num_micro_batches: int,
          cluster: str, schedule: str = "1f1b") -> Plan:
    model = load_model(MODEL_FILE).to_mapping()
    return Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": cluster, "model": model,
                   # bf16 is what the cost model knows; it sets 4-byte (fp32) gradients, as the
                   # runner's float32 training has.
                   "training": {"global_batch_size": micro_batch_size * num_micro_batches,
                                "seq_len": SEQ_LEN, "precision": "bf16",
                                # the kernels the CPU runner computes (docs/runner.md): its
                                # explicit softmax and F.cross_entropy on fp32 logits
                                "attention": "unfused", "cross_entropy": "plain"}},
        "micro_batch_size": micro_batch_size, "num_micro_batches": num_micro_batches,
        "schedule": schedule, "stages": stages})


def _stage(i: int, blocks: tuple[int, int], last: bool, replicas: list[tuple[str, int]]) -> dict:
    return {"index": i, "blocks": list(blocks), "embedding": i == 0, "head": last,
            "replicas": [{"gpu_type": "cpu", "tp": 1, "micro_batch_share": share,
                          "devices": [dev]} for dev, share in replicas]}


def pipeline_plan(num_stages: int, micro_batch_size: int = 2, num_micro_batches: int = 4,
                  cluster: str = "cpu-local") -> Plan:
    """``num_stages`` stages of 4/num_stages blocks, one process each."""
    per = 4 // num_stages
    stages = [_stage(i, (i * per, (i + 1) * per), i == num_stages - 1, [(f"cpu:{i}", micro_batch_size)])
              for i in range(num_stages)]
    return _plan(stages, micro_batch_size, num_micro_batches, cluster)


def data_parallel_plan(num_stages: int, replicas: int, micro_batch_size: int = 2,
                       num_micro_batches: int = 4, cluster: str = "cpu-local") -> Plan:
    """``num_stages`` stages, each with ``replicas`` single-process replicas sharing equally."""
    per = 4 // num_stages
    share = micro_batch_size // replicas
    stages = []
    for i in range(num_stages):
        devs = [(f"cpu:{i * replicas + j}", share) for j in range(replicas)]
        stages.append(_stage(i, (i * per, (i + 1) * per), i == num_stages - 1, devs))
    return _plan(stages, micro_batch_size, num_micro_batches, cluster)


# (name, plan, cluster spec): 2 processes on the 2-core machine, and a 4-process pipeline on
# its 2 cores.
CASES = {
    "pp2": (lambda: pipeline_plan(2), "cpu-local"),
    "dp2": (lambda: data_parallel_plan(1, 2), "cpu-local"),
    "pp4": (lambda: pipeline_plan(4, cluster="cpu-local-4"), "cpu-local-4"),
}
TOLERANCE = 0.25


def profile_here(out: Path) -> Path:
    """Profile cpu-small on this machine now and write cluster specs that map it; returns the
    folder holding cpu-local.yaml and cpu-local-4.yaml."""
    from planner.cli.main import main
    profile = out / "cpu-small-x2.yaml"
    assert main(["profile", "--model", str(MODEL_FILE), "--device", "cpu", "--micro-batch", "1,2",
                 "--tp", "1", "--seq-len", str(SEQ_LEN), "--concurrent", "2", "--repeats", "40",
                 "--warmup", "5", "--gpu-type", "cpu", "-o", str(profile), "--quiet"]) == 0
    # The runner trains the (bf16) plans in fp32: the fp32 timings stand in for bf16, as the
    # committed profiles say (docs/profiles.md, "Precision").
    text = profile.read_text()
    assert "\ndtype: fp32\n" in text
    profile.write_text(text.replace("\ndtype: fp32\n", "\ndtype: fp32\nstands_in_for: [bf16]\n"))
    for name in ("cpu-local", "cpu-local-4"):
        spec = (ROOT / "cluster_specs" / f"{name}.yaml").read_text()
        assert "../profiles/cpu-small-x2.yaml" in spec
        (out / f"{name}.yaml").write_text(spec.replace("../profiles/cpu-small-x2.yaml", str(profile)))
    return out


@pytest.fixture(scope="module")
def clusters_here(tmp_path_factory) -> tuple[Path, list[float]]:
    """The profiled cluster folder, with the speed probes taken before and after profiling."""
    require_quiet_machine()
    before = speed_probe_s()
    folder = profile_here(tmp_path_factory.mktemp("e2e"))
    return folder, [before, speed_probe_s()]


def predict_and_run(name: str, steps: int = 8, clusters: Path | None = None) -> tuple[float, list[float], dict]:
    """(predicted step time, measured step times without the first (start-up), breakdown);
    the tests compare the median step with the prediction.  ``clusters``: the folder of the
    cluster specs (default: the committed ones and their committed profiles)."""
    from planner.cost import evaluate
    from planner.launch.runner import run_plan
    from planner.profile import load_profiles
    from planner.spec import load_cluster
    make, cluster_name = CASES[name]
    plan = make()
    spec = (clusters or ROOT / "cluster_specs") / f"{cluster_name}.yaml"
    cluster = load_cluster(spec)
    profiles = load_profiles(cluster=cluster, cluster_path=spec)
    # The runner all-reduces gradients after the last backward, without overlap.
    ev = evaluate(cluster, plan, profiles=profiles, grad_reduce_overlap=False)
    assert profiles.usage()["estimated"] == 0, profiles.usage()
    run = run_plan(plan, steps=steps, backend="gloo")
    return ev.iteration_time_s, run.step_time_s[1:], ev.breakdown_s



# A measurement is a profile and a run of the plan; it counts only when speed probes before, between
# and after them agree (tests/timing.py), since a neighbour that slows the profile and not the
# run, or the run and not the profile, shows as a prediction error that is not the model's.  Seen
# on a shared CI machine: a profile 1.55x slow while its run was not, then a run 1.3x slow.
MAX_MEASUREMENTS = 4


def _measure_and_compare(name: str, clusters_here: tuple[Path, list[float]], tmp_path: Path) -> None:
    def measurements():
        clusters, probes = clusters_here
        for attempt in range(1, MAX_MEASUREMENTS + 1):
            if attempt > 1:
                probes = [speed_probe_s()]
                clusters = profile_here(tmp_path / f"measurement{attempt}")
            probes = probes + [speed_probe_s()]
            predicted, steps, breakdown = predict_and_run(name, clusters=clusters)
            probes.append(speed_probe_s())
            measured = statistics.median(steps)
            error = measured / predicted - 1
            spread = probe_spread(probes)
            void = "" if timing_forced() or spread <= STEADY_SPREAD else ", void: the machine changed speed"
            print(f"{name} (measurement {attempt}{void}): "
                  f"predicted {predicted * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms, error {error:+.1%}, "
                  f"fastest step {min(steps) * 1e3:.1f} ms, probes {[round(p * 1e3, 1) for p in probes]} ms "
                  f"(spread {spread:.0%}), breakdown {breakdown}")
            yield error, probes

    errors = steady_errors(measurements(), TOLERANCE, MAX_MEASUREMENTS)
    assert abs(errors[-1]) <= TOLERANCE, errors


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pp2", "dp2"])
def test_two_process_prediction_within_25_percent(name, clusters_here, tmp_path):
    require_quiet_machine()
    _measure_and_compare(name, clusters_here, tmp_path)


@pytest.mark.slow
def test_four_processes_on_two_cores_within_25_percent(clusters_here, tmp_path):
    """Four processes share the two cores (cpu-local-4: `cores: 2`). The prediction runs the
    1F1B schedule under processor sharing, so the fill and drain, where fewer than four
    compute, are not slowed as much as the steady state (docs/profiles.md)."""
    require_quiet_machine()
    _measure_and_compare("pp4", clusters_here, tmp_path)
