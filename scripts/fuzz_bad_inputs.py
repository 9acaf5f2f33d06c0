"""Bad inputs, generated: a valid random cluster (and custom model) from fuzz_plans.py with one
mutation that makes it invalid, through ``planner plan`` in a subprocess, as a user runs it.

    PYTHONPATH=$PWD python scripts/fuzz_bad_inputs.py --seed 1 --cases 300 --out /tmp/fuzz-bad

Each mutation is one a user makes (a missing key, a typo, a wrong type, a negative or zero
number, a bare number for a quantity, an unknown GPU or zone, a duplicate name, a model shape
whose heads do not divide); the expected answer is exit 2 with a first line naming the file, the
line and the field path, and no plan file.  Anything else goes to ``OUT/failures.jsonl``.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import shutil
import sys
from pathlib import Path

import yaml
from fuzz_plans import Runner, check_stderr, random_cluster, random_model

# A located message: "error: FILE:LINE[:COL]: FIELD.PATH: ..." (planner.errors.Location).
_LOCATED = re.compile(r"^error: (cluster|model)\.yaml:(\d+)(:\d+)?: ([A-Za-z_][\w.\[\]]*): ")


def _group(rng, cluster):
    return rng.randrange(len(cluster["nodes"]))


def mutate_cluster(rng: random.Random, cluster: dict) -> tuple[str, str]:
    """Break ``cluster`` in place in one way; returns (what was done, the field path to name)."""
    g = _group(rng, cluster)
    node = cluster["nodes"][g]
    kind = rng.choice(("drop", "typo", "negative", "zero", "bare", "string", "list", "gpu", "zone", "dup",
                       "link_zone", "link_bw", "null"))
    if kind == "drop":
        key = rng.choice(("gpu", "gpus_per_node"))
        del node[key]
        return f"drop nodes[{g}].{key}", f"nodes[{g}].{key}"
    if kind == "typo":
        node["gpus_per_nod"] = node.pop("gpus_per_node")
        return f"typo nodes[{g}].gpus_per_nod", f"nodes[{g}].gpus_per_nod"
    if kind in ("negative", "zero"):
        key = rng.choice(("gpus_per_node", "count", "network_bandwidth", "price_per_hour"))
        value = {"gpus_per_node": -2, "count": -1, "network_bandwidth": "-10 Gbit/s",
                 "price_per_hour": -1.5}[key] if kind == "negative" else \
            {"gpus_per_node": 0, "count": 0, "network_bandwidth": "0 Gbit/s", "price_per_hour": None}[key]
        if value is None:   # a zero price is a valid (free) node
            value, key = 0, "gpus_per_node"
        node[key] = value
        return f"{kind} nodes[{g}].{key} = {value!r}", f"nodes[{g}].{key}"
    if kind == "bare":
        node["network_bandwidth"] = 100
        return f"bare nodes[{g}].network_bandwidth = 100", f"nodes[{g}].network_bandwidth"
    if kind == "string":
        node["gpus_per_node"] = "eight"
        return f"string nodes[{g}].gpus_per_node", f"nodes[{g}].gpus_per_node"
    if kind == "list":
        node["gpus_per_node"] = [4, 4]
        return f"list nodes[{g}].gpus_per_node", f"nodes[{g}].gpus_per_node"
    if kind == "null":
        node["gpu"] = None
        return f"null nodes[{g}].gpu", f"nodes[{g}].gpu"
    if kind == "gpu":
        node["gpu"] = rng.choice(("A100-SXM4-81GB", "H100", "B300", "rtx5090", ""))
        return f"unknown gpu nodes[{g}].gpu = {node['gpu']!r}", f"nodes[{g}].gpu"
    if kind == "zone":
        node["zone"] = "nowhere"
        return f"unknown zone nodes[{g}].zone", f"nodes[{g}].zone"
    if kind == "dup" and len(cluster["nodes"]) > 1:
        other = (g + 1) % len(cluster["nodes"])
        cluster["nodes"][other]["name"] = node["name"]
        for n in (node, cluster["nodes"][other]):
            n.pop("count", None)      # g0-0 vs g0: the names themselves must clash
        return f"duplicate name {node['name']!r}", f"nodes[{max(g, other)}].name"
    if kind in ("link_zone", "link_bw") and cluster.get("links"):
        link = rng.randrange(len(cluster["links"]))
        if kind == "link_zone":
            cluster["links"][link]["between"][1] = "nowhere"
            return f"links[{link}] to an unknown zone", f"links[{link}].between[1]"
        cluster["links"][link]["bandwidth"] = rng.choice(("-1 Gbit/s", "fast", "10", "10 Gbit"))
        return f"links[{link}].bandwidth = {cluster['links'][link]['bandwidth']!r}", f"links[{link}].bandwidth"
    node["gpus_per_node"] = 0
    return f"zero nodes[{g}].gpus_per_node (fallback)", f"nodes[{g}].gpus_per_node"


def mutate_model(rng: random.Random, model: dict) -> tuple[str, str]:
    kind = rng.choice(("heads", "kv", "layers", "mlp", "drop", "topk"))
    if kind == "heads":
        model.pop("head_dim", None)
        model["num_attention_heads"] = model["hidden_size"] + 1
        return "heads not dividing hidden", "num_attention_heads"
    if kind == "kv":
        model["num_kv_heads"] = model["num_attention_heads"] + 1
        return "kv heads not dividing heads", "num_kv_heads"
    if kind == "layers":
        model["num_layers"] = rng.choice((0, -3, 2.5))
        return f"num_layers = {model['num_layers']}", "num_layers"
    if kind == "mlp":
        model["mlp"] = "relu"
        return "mlp relu", "mlp"
    if kind == "drop":
        del model["vocab_size"]
        return "no vocab_size", "vocab_size"
    model.update(num_experts=4, moe_top_k=5)
    return "moe_top_k > num_experts", "moe_top_k"


def run_bad_case(seed: int, index: int, out_dir: Path) -> dict:
    rng = random.Random(seed * 1_000_003 + index)
    case_dir = out_dir / f"bad-{seed}-{index:04d}"
    shutil.rmtree(case_dir, ignore_errors=True)
    case_dir.mkdir(parents=True)
    cluster = random_cluster(rng, f"bad-{seed}-{index}")
    # fuzz_plans leaves a GPU type of its own without a NIC speed at times (an error path it
    # checks); here the base must be valid, or a model's mutation is reported as the cluster's
    for group in cluster["nodes"]:
        if isinstance(group["gpu"], dict):
            group.setdefault("network_bandwidth", "100 Gbit/s")
    model = random_model(rng)
    if rng.random() < 0.7:
        cluster = copy.deepcopy(cluster)
        what, field = mutate_cluster(rng, cluster)
        file = "cluster.yaml"
    else:
        what, field = mutate_model(rng, model)
        file = "model.yaml"
    (case_dir / "cluster.yaml").write_text(yaml.safe_dump(cluster, sort_keys=False))
    (case_dir / "model.yaml").write_text(yaml.safe_dump(model, sort_keys=False))
    args = ["plan", "cluster.yaml", "--model", "model.yaml", "--global-batch-size", "8", "--seq-len", "512",
            "--precision", "fp16", "--time-limit", "3", "-o", "plan.json", "--quiet"]
    rc, _, err, _ = Runner(case_dir).cli(args, timeout_s=60)
    problems: list[str] = []
    check_stderr("plan", rc, err, problems)
    if rc != 2:
        problems.append(f"exit {rc}, not 2, for: {what}")
    if (case_dir / "plan.json").exists():
        problems.append("plan.json written")
    first = err.strip().splitlines()[0] if err.strip() else ""
    match = _LOCATED.match(first)
    if rc == 2 and (not match or not any(
            f"{m.group(1)}.yaml" == file and m.group(4) == field for m in map(_LOCATED.match, _error_lines(err))
            if m)):
        problems.append(f"no error line names {file}:LINE: {field}")
    return {"seed": seed, "index": index, "rc": rc, "mutation": what, "field": field, "file": file,
            "problems": problems, "stderr": err.strip()[:600],
            "command": f"cd {case_dir} && planner " + " ".join(args)}


def _error_lines(err: str) -> list[str]:
    """The message's lines, each in the first line's "error: " form (InputErrors: one a problem)."""
    lines = err.strip().splitlines()
    return [lines[0]] + [f"error: {line}" for line in lines[1:]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--out", type=Path, default=Path("/tmp/planner-fuzz-bad"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    with open(args.out / "results.jsonl", "a") as results:
        for index in range(args.cases):
            record = run_bad_case(args.seed, index, args.out)
            results.write(json.dumps(record) + "\n")
            results.flush()
            failed += bool(record["problems"])
            print(f"[{index}] {'FAIL' if record['problems'] else 'ok'} {record['mutation']}"
                  + "".join(f"\n    {p}\n    {record['stderr'][:300]}" for p in record["problems"]), flush=True)
    print(f"{args.cases} cases, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
