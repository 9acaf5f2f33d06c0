"""Keeping an old plan's devices where it can (``planner replan``):

- ``repair``: the old plan after lost nodes.  A replica on a lost node moves to a node the
  plan leaves idle with the same GPU type (same local indices); with no such node left, the
  replica is dropped and its sequences go to the stage's other replicas (shares differing by
  at most one).  ``None`` when a stage loses every replica, or the result does not fit.
- ``relabel``: a fresh plan with its nodes renamed, inside each node class (identical nodes:
  same GPU, zone, NICs, price), to those that held the same state in the old plan.  Nodes of
  one class are interchangeable, so the plan's prediction does not change (checked: the
  renamed plan is kept only when it prices the same) while fewer bytes move.
"""

from __future__ import annotations

from collections import defaultdict

from planner.errors import InputError
from planner.migrate import held_ranges, kept_bytes, shards
from planner.plan import Plan, check_plan


def _node(dev: str) -> str:
    return dev.rpartition(":")[0]


def _renamed(plan: Plan, names: dict[str, str]) -> Plan:
    stages = []
    for st in plan.stages:
        reps = [r.model_copy(update={"devices": tuple(f"{names.get(_node(d), _node(d))}:{d.rpartition(':')[2]}"
                                                       for d in r.devices)}) for r in st.replicas]
        stages.append(st.model_copy(update={"replicas": tuple(reps)}))
    return plan.model_copy(update={"stages": tuple(stages), "launch": None})


def _spread(shares: list[int], extra: int) -> list[int]:
    """``extra`` sequences added to ``shares``, each to the replica holding fewest."""
    out = list(shares)
    for _ in range(extra):
        i = min(range(len(out)), key=lambda k: (out[k], k))
        out[i] += 1
    return out


def repair(cluster, old: Plan, topo) -> Plan | None:
    """The old plan with its lost nodes replaced (module doc); ``old`` itself when none is lost."""
    used = {_node(d) for d in old.devices()}
    lost = sorted(n for n in used if not topo.has_device(f"{n}:0"))
    if not lost:
        return old
    spare = [n for n in cluster.node_list if n.name not in used]
    names: dict[str, str] = {}
    for name in lost:
        reps = [r for st in old.stages for r in st.replicas if r.node == name]
        need = max(int(d.rpartition(":")[2]) for r in reps for d in r.devices) + 1
        gpu = reps[0].gpu_type
        pick = next((n for n in spare if n.gpu.name == gpu and n.gpus_per_node >= need), None)
        if pick is not None:
            spare.remove(pick)
            names[name] = pick.name
    stages = []
    for st in _renamed(old, names).stages:
        keep = [r for r in st.replicas if topo.has_device(r.devices[0])]
        if not keep:
            return None
        dropped = sum(r.micro_batch_share for r in st.replicas) - sum(r.micro_batch_share for r in keep)
        shares = _spread([r.micro_batch_share for r in keep], dropped)
        reps = tuple(r.model_copy(update={"micro_batch_share": s}) for r, s in zip(keep, shares))
        stages.append(st.model_copy(update={"replicas": reps}))
    fixed = old.model_copy(update={"stages": tuple(stages), "launch": None})
    try:
        check_plan(cluster, fixed)
    except InputError:
        return None
    return fixed


def relabel(fresh: Plan, old: Plan, model, topo) -> Plan:
    """``fresh`` with its nodes renamed within their classes to keep most of ``old`` 's state
    in place (module doc); greedy on the bytes each (fresh node, class node) pair keeps."""
    before = shards(old, model)
    held = held_ranges(before)
    after = shards(fresh, model)
    by_node: dict[str, list[tuple[str, list]]] = defaultdict(list)
    for dev, ss in after.items():
        by_node[_node(dev)].append((dev.rpartition(":")[2], ss))
    names: dict[str, str] = {}
    by_class: dict[tuple, list[str]] = defaultdict(list)
    for n in sorted(by_node):
        by_class[topo.node_class_of(n).node_names].append(n)
    for members, nodes in by_class.items():
        pairs = []
        for u in nodes:
            for c in members:
                kept = sum(kept_bytes(s, held.get(f"{c}:{i}", {})) for i, ss in by_node[u] for s in ss)
                pairs.append((-kept, u, c))
        taken: set[str] = set()
        for neg, u, c in sorted(pairs):
            if u in names or c in taken or neg == 0:
                continue
            names[u], _ = c, taken.add(c)
        # the rest keep their own name where it is free, else the first free node of the class
        for u in nodes:
            if u not in names and u not in taken:
                names[u], _ = u, taken.add(u)
        for u in nodes:
            if u not in names:
                c = next(c for c in members if c not in taken)
                names[u], _ = c, taken.add(c)
    return _renamed(fresh, names)
