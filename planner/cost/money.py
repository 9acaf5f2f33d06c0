"""What a plan costs per hour: node-hours at the spec's prices plus egress over priced links.

- Nodes: every node holding at least one device of the plan is rented whole, at the spec's
  ``price_per_hour`` (per node-hour; else the catalog's per-GPU price times GPUs per node).
  If any used node has no price, the plan has no price (None), rather than a wrong one.
- Egress: bytes per iteration that cross a zone link with an ``egress_price_per_gb``
  (decimal GB, as clouds bill), times that price, over the iteration time, times 3600.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Money:
    nodes_usd_per_hour: float | None
    egress_usd_per_hour: float
    egress_bytes_per_iteration: float

    @property
    def usd_per_hour(self) -> float | None:
        if self.nodes_usd_per_hour is None:
            return None
        return self.nodes_usd_per_hour + self.egress_usd_per_hour


def nodes_usd_per_hour(cluster, node_names) -> float | None:
    total = 0.0
    for name in sorted(set(node_names)):
        price = cluster.node_by_name[name].group.price_usd_per_hour
        if price is None:
            return None
        total += price
    return total


def egress_usd_per_iteration(cluster, crossings: dict[tuple[str, str], float]) -> float:
    """``crossings``: (zone_a, zone_b) -> bytes per iteration across that link (either way)."""
    usd = 0.0
    for (za, zb), num_bytes in sorted(crossings.items()):
        link = cluster.link(za, zb)
        if link is not None:
            usd += num_bytes / 1e9 * link.egress_price_per_gb_usd
    return usd


def plan_money(cluster, node_names, crossings: dict[tuple[str, str], float], iteration_time_s: float) -> Money:
    per_iter = egress_usd_per_iteration(cluster, crossings)
    egress = per_iter / iteration_time_s * 3600 if iteration_time_s > 0 else 0.0
    return Money(nodes_usd_per_hour(cluster, node_names), egress, sum(crossings.values()))
