"""Which prices a plan's USD/hour rests on: a node group without ``price_per_hour`` is priced at
its GPU's catalog default, one cloud's on-demand list price on a stated date
(planner/catalog/gpus.yaml).  The summary says so, naming the cloud, instance, region and date
from the catalog's source (or the whole source where it is not in the catalog format, e.g. a
figure not re-verified), so that nobody takes a default for what they pay."""

from __future__ import annotations

from planner.api import catalog, parse_price_source


def price_source_text(source: str) -> str:
    """The short form of a catalog price source: cloud, instance, region and date where the
    source is in the catalog format (the URL stays in the catalog); the text as it is otherwise."""
    parsed = parse_price_source(source)
    return source if parsed is None else parsed.short()


def _catalog_priced(gpu) -> bool:
    """Whether ``gpu`` is the catalog's own entry, so that its price is the catalog default.  An
    inline GPU mapping's price_per_hour is what its user wrote, even under a catalog id's name and
    figures: compared whole, such a copy differs from the entry (its sources and aliases at least)."""
    found = catalog.find_gpu(gpu.name)
    return found is not None and gpu == found


def default_price_notes(cluster, plan) -> list[str]:
    """One line per GPU type of the plan priced at the catalog default, in spec order."""
    used = {d.rpartition(":")[0] for d in plan.devices()}
    notes, seen = [], set()
    for group in cluster.nodes:
        gpu = group.gpu
        if (group.price_per_hour_usd is not None or gpu.price_per_hour_usd is None or gpu.name in seen
                or not _catalog_priced(gpu) or not used.intersection(group.node_names)):
            continue
        seen.add(gpu.name)
        source = price_source_text(gpu.sources.get("price_per_hour", "no source recorded"))
        notes.append(f"price: {gpu.name} at the catalog default {gpu.price_per_hour_usd:.2f} USD per GPU-hour "
                     f"({source}); set price_per_hour on its node group for what you pay")
    return notes
