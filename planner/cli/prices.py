"""Which prices a plan's USD/hour rests on: a node group without ``price_per_hour`` is priced at
its GPU's catalog default, a recalled public list price whose date is mostly unknown
(planner/catalog/gpus.yaml).  The summary says so, with the catalog's source, so that nobody
takes a default for what they pay."""

from __future__ import annotations


def default_price_notes(cluster, plan) -> list[str]:
    """One line per GPU type of the plan priced at the catalog default, in spec order."""
    used = {d.rpartition(":")[0] for d in plan.devices()}
    notes, seen = [], set()
    for group in cluster.nodes:
        gpu = group.gpu
        if (group.price_per_hour_usd is not None or gpu.price_per_hour_usd is None or gpu.name in seen
                or not used.intersection(group.node_names)):
            continue
        seen.add(gpu.name)
        source = gpu.sources.get("price_per_hour", "no source recorded")
        notes.append(f"price: {gpu.name} at the catalog default {gpu.price_per_hour_usd:.2f} USD per GPU-hour "
                     f"({source}); set price_per_hour on its node group for what you pay")
    return notes
