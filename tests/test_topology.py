"""Topology: paths between devices, rings, hierarchies and node classes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.spec import cluster_from_dict, load_cluster
from planner.topology import INTRA_NODE_LATENCY_S, NETWORK_LATENCY_S, Topology

SPECS = Path(__file__).resolve().parent.parent / "cluster_specs"
GBIT = 1e9 / 8


@pytest.fixture(scope="module")
def two_zone() -> Topology:
    return Topology(load_cluster(SPECS / "tiny-2zone.yaml"))


@pytest.fixture(scope="module")
def mixed() -> Topology:
    return Topology(load_cluster(SPECS / "tiny-mixed.yaml"))


@pytest.mark.parametrize("name", ["tiny-2gpu", "tiny-mixed", "tiny-2zone"])
def test_tiny_specs_load(name):
    cluster = load_cluster(SPECS / f"{name}.yaml")
    topo = Topology(cluster)
    assert len(topo.device_ids()) == cluster.num_gpus


def test_p2p_kinds_and_bandwidths(two_zone):
    same = two_zone.p2p("a100-0:0", "a100-0:0")
    assert same.kind == "same-device" and same.time_s(1e9) == 0.0

    nv = two_zone.p2p("a100-0:0", "a100-0:1")
    assert nv.kind == "nvlink"
    assert nv.bandwidth_Bps == pytest.approx(300e9)  # A100 SXM4 NVLink, per direction
    assert nv.latency_s == INTRA_NODE_LATENCY_S

    net = two_zone.p2p("a100-0:1", "a100-1:0")
    assert net.kind == "network"
    # 100 Gbit/s for the node, 2 GPUs per node: one GPU's flow gets half.
    assert net.bandwidth_Bps == pytest.approx(100 * GBIT / 2)
    assert net.latency_s == NETWORK_LATENCY_S

    wan = two_zone.p2p("a100-0:0", "l4-1:1")
    assert wan.kind == "zone-link"
    assert wan.bandwidth_Bps == pytest.approx(10 * GBIT)  # the link, below both NIC shares
    assert wan.latency_s == pytest.approx(0.020)
    assert wan.time_s(1.25e9) == pytest.approx(1.02)


def test_p2p_is_symmetric_and_capped_by_slower_nic(mixed):
    a = mixed.p2p("a100:0", "v100:3")
    b = mixed.p2p("v100:3", "a100:0")
    assert a == b
    assert a.bandwidth_Bps == pytest.approx(100 * GBIT / 4)


def test_zone_link_capped_by_nic_when_nic_is_slower():
    cluster = cluster_from_dict({
        "name": "x", "zones": [{"name": "a"}, {"name": "b"}],
        "nodes": [{"name": "p", "zone": "a", "gpu": "A100-SXM4-80GB", "gpus_per_node": 8,
                   "network_bandwidth": "80 Gbit/s"},
                  {"name": "q", "zone": "b", "gpu": "A100-SXM4-80GB", "gpus_per_node": 8,
                   "network_bandwidth": "800 Gbit/s"}],
        "links": [{"between": ["a", "b"], "bandwidth": "100 Gbit/s", "latency": "1 ms"}]})
    path = Topology(cluster).p2p("p:0", "q:0")
    assert path.kind == "zone-link"
    assert path.bandwidth_Bps == pytest.approx(10 * GBIT)  # 80 Gbit/s over 8 GPUs


def test_unknown_device_names_nodes(two_zone):
    with pytest.raises(InputError) as exc:
        two_zone.p2p("a100-0:0", "h100-0:0")
    assert "h100-0:0" in str(exc.value) and "a100-0" in str(exc.value)
    with pytest.raises(InputError):
        two_zone.node_of("a100-0:2")  # only 2 GPUs per node
    assert not two_zone.has_device("a100-0:x")


def test_ring_inside_node_uses_nvlink(two_zone):
    ring = two_zone.ring(["a100-0:1", "a100-0:0"])
    assert ring.kind == "nvlink" and ring.size == 2
    assert ring.bandwidth_Bps == pytest.approx(300e9)
    # all-reduce of 1 GB over 2 devices: 2*(1/2)*1e9/300e9 + 2*latency
    assert ring.allreduce_s(1e9) == pytest.approx(1e9 / 300e9 + 2 * INTRA_NODE_LATENCY_S)


def test_ring_across_nodes_uses_nic_share_per_member(two_zone):
    one_each = two_zone.ring(["a100-0:0", "a100-1:0"])
    assert one_each.kind == "network"
    assert one_each.bandwidth_Bps == pytest.approx(100 * GBIT / 2)
    # Two members per node: two channels, two NIC shares = the whole NIC.
    both = two_zone.ring(["a100-0:0", "a100-0:1", "a100-1:0", "a100-1:1"])
    assert both.bandwidth_Bps == pytest.approx(100 * GBIT)
    assert both.size == 4


def test_ring_across_zones_and_concurrent_rings_share_aggregate(two_zone):
    devs = ["a100-0:0", "l4-0:0"]
    alone = two_zone.ring(devs)
    assert alone.kind == "zone-link"
    assert alone.bandwidth_Bps == pytest.approx(10 * GBIT)
    assert alone.latency_s == pytest.approx(0.020)
    # aggregate 20 Gbit/s: two rings still get 10 each, four rings get 5 each.
    assert two_zone.ring(devs, concurrent_rings=2).bandwidth_Bps == pytest.approx(10 * GBIT)
    assert two_zone.ring(devs, concurrent_rings=4).bandwidth_Bps == pytest.approx(5 * GBIT)


def test_ring_single_device_is_free(two_zone):
    ring = two_zone.ring(["l4-0:0"])
    assert ring.size == 1 and ring.allreduce_s(1e9) == 0.0


def test_hierarchical_levels(two_zone):
    h = two_zone.hierarchical(["a100-0:0", "a100-0:1", "a100-1:0", "a100-1:1"])
    assert h.num_nodes == 2 and h.max_devices_per_node == 2
    assert h.intra.bandwidth_Bps == pytest.approx(300e9)
    # Node leaders may use all NICs of the node.
    assert h.inter.bandwidth_Bps == pytest.approx(100 * GBIT)
    assert h.inter.kind == "network"
    cross = two_zone.hierarchical(["a100-0:0", "l4-0:0", "l4-0:1"])
    assert cross.inter.kind == "zone-link" and cross.inter.bandwidth_Bps == pytest.approx(10 * GBIT)
    assert cross.intra.bandwidth_Bps == pytest.approx(two_zone.node("l4-0").group.intra_Bps)


def test_node_classes_group_identical_nodes(two_zone):
    classes = two_zone.node_classes()
    assert [(c.gpu_name, c.zone, c.count, c.node_names) for c in classes] == [
        ("A100-SXM4-80GB", "zone-a", 2, ("a100-0", "a100-1")),
        ("L4-24GB", "zone-b", 2, ("l4-0", "l4-1")),
    ]
    assert classes[0].num_gpus == 4
    assert two_zone.node_class_of("l4-1") is classes[1]


def test_node_classes_split_on_any_difference():
    cluster = cluster_from_dict({
        "name": "x",
        "nodes": [{"name": "b", "count": 2, "gpu": "A100-SXM4-80GB", "gpus_per_node": 8,
                   "network_bandwidth": "400 Gbit/s"},
                  {"name": "a", "count": 3, "gpu": "A100-SXM4-80GB", "gpus_per_node": 8,
                   "network_bandwidth": "800 Gbit/s"},
                  {"name": "c", "gpu": "A100-SXM4-80GB", "gpus_per_node": 8,
                   "network_bandwidth": "800 Gbit/s"}]})
    classes = Topology(cluster).node_classes()
    # Same figures merge across groups (a and c); other NIC speed splits (b).
    assert [(c.network_Bps, c.node_names) for c in classes] == [
        (400 * GBIT, ("b-0", "b-1")), (800 * GBIT, ("a-0", "a-1", "a-2", "c"))]


def test_deterministic_regardless_of_input_order(two_zone):
    devs = ["l4-1:1", "a100-1:0", "a100-0:1", "l4-0:0"]
    assert two_zone.sort_devices(devs) == ["a100-0:1", "a100-1:0", "l4-0:0", "l4-1:1"]
    # A fresh topology, so the second ring is computed, not read back from the first's cache.
    fresh = Topology(load_cluster(SPECS / "tiny-2zone.yaml"))
    assert fresh.ring(list(reversed(devs))) == two_zone.ring(devs)


def test_large_cluster_builds_without_pairwise_edges():
    # Speed is measured by `make bench`, not asserted here (shared machines are noisy).
    cluster = cluster_from_dict({"name": "big", "nodes": [
        {"name": "h", "count": 1024, "gpu": "H100-SXM5-80GB", "gpus_per_node": 8,
         "network_bandwidth": "3200 Gbit/s"},
        {"name": "a", "count": 1024, "gpu": "A100-SXM4-80GB", "gpus_per_node": 8,
         "network_bandwidth": "1600 Gbit/s"}]})
    topo = Topology(cluster)
    classes = topo.node_classes()
    path = topo.p2p("h-0:0", "a-1023:7")
    assert len(topo.device_ids()) == 16384
    assert len(classes) == 2
    assert path.bandwidth_Bps == pytest.approx(1600 * GBIT / 8)
    # The graph holds device-node edges, never one per device pair.
    assert topo.graph.number_of_edges() < 20000
    assert math.isinf(topo.ring(["h-0:0"]).bandwidth_Bps)


def test_zones_without_direct_link_route_over_links():
    # The spec loader insists on a direct link between zones holding nodes; a cluster built
    # in code may not have one, and the route takes the narrowest hop and summed latency.
    from planner.catalog import gpu
    from planner.spec import Cluster
    from planner.spec.quantities import numbers_in_base_units

    node = {"gpu": gpu("A100-SXM4-80GB"), "gpus_per_node": 1, "network_bandwidth": 100 * GBIT}
    with numbers_in_base_units():
        cluster = Cluster.model_validate({
            "name": "hops", "zones": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "nodes": [{"name": "x", "zone": "a", **node}, {"name": "y", "zone": "c", **node}],
            "links": [{"between": ["a", "b"], "bandwidth": 4 * GBIT, "latency": 0.010},
                      {"between": ["b", "c"], "bandwidth": 2 * GBIT, "latency": 0.005}]})
    path = Topology(cluster).p2p("x:0", "y:0")
    assert path.kind == "zone-link"
    assert path.bandwidth_Bps == pytest.approx(2 * GBIT)
    assert path.latency_s == pytest.approx(0.015)
