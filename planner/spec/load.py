"""Reading cluster, model and training specs from files into frozen, cross-checked models."""

from __future__ import annotations

import hashlib
from itertools import combinations
from pathlib import Path

from planner import catalog
from planner.errors import InputError, InputErrors
from planner.spec import limits
from planner.spec.cluster import DEFAULT_ZONE, Cluster
from planner.spec.gpu import GpuType
from planner.spec.model import ModelSpec
from planner.spec.source import Document, document_from_data, format_field_path, load_yaml, validate_model
from planner.spec.training import Training

# A node whose GPU type has no catalog NIC figure and whose spec gives none: we refuse to
# guess, since the inter-node bandwidth decides data- and pipeline-parallel costs.


def _resolve_gpus(doc: Document, errors: list[InputError]) -> set[str]:
    """Replace each node's ``gpu`` by a ``GpuType``; returns the field paths of the GPUs whose
    errors are already in ``errors`` (the cluster model would report them a second time)."""
    failed: set[str] = set()
    nodes = doc.data.get("nodes") if isinstance(doc.data, dict) else None
    if not isinstance(nodes, list):
        return failed
    for i, node in enumerate(nodes):
        if not isinstance(node, dict) or "gpu" not in node:
            continue
        value = node["gpu"]
        path = ("nodes", i, "gpu")
        if isinstance(value, str):
            found = catalog.find_gpu(value)
            if found is None:
                errors.append(doc.error(path, f"unknown GPU type {value!r}{catalog.unknown_gpu_hint(value)}; use a catalog id "
                                        f"({', '.join(catalog.gpus())}) or a mapping with name, "
                                        "memory, peak_tflops, memory_bandwidth, intra_node_bandwidth "
                                        "(optionally fp32_tflops, tf32_tflops, price_per_hour, "
                                        "nic_bandwidth_per_gpu)"))
                failed.add(format_field_path(path))
            else:
                node["gpu"] = found
        elif isinstance(value, dict):
            try:
                node["gpu"] = validate_model(GpuType, doc, path, data=value)
            except InputErrors as exc:
                errors.extend(exc.errors)
                failed.add(format_field_path(path))
        else:
            errors.append(doc.error(path, "gpu must be a catalog id or a mapping"))
            failed.add(format_field_path(path))
    return failed


def _fill_defaults(cluster: Cluster, doc: Document, errors: list[InputError]) -> Cluster:
    groups = []
    for i, group in enumerate(cluster.nodes):
        update = {}
        # An inline copy of a catalog GPU (same name and figures) without its fp32 / tf32 peaks
        # takes the catalog's, rather than the peak_tflops / 16 stand-in.
        found = catalog.find_gpu(group.gpu.name)
        if found is not None and group.gpu is not found and _figures(found) == _figures(group.gpu):
            fill = {f: getattr(found, f) for f in _PRECISION_FIGURES if getattr(group.gpu, f) is None}
            if any(v is not None for v in fill.values()):
                update["gpu"] = group.gpu.model_copy(update=fill)
        if group.network_bandwidth_Bps is None:
            nic = group.gpu.nic_bandwidth_per_gpu_Bps
            if nic is None:
                errors.append(doc.error(("nodes", i), f"network_bandwidth is missing and GPU type "
                                        f"{group.gpu.name!r} has no catalog default; give it, "
                                        "e.g. 'network_bandwidth: 100 Gbit/s'"))
                nic = 0.0
            update["network_bandwidth_Bps"] = nic * group.gpus_per_node
        groups.append(group.model_copy(update=update) if update else group)
    return cluster.model_copy(update={"nodes": tuple(groups)})


def _figures(gpu: GpuType) -> tuple:
    return (gpu.memory_bytes, gpu.peak_tflops, gpu.memory_bandwidth_Bps, gpu.intra_node_bandwidth_Bps)


_PRECISION_FIGURES = ("fp32_tflops", "tf32_tflops")


def _same_gpu(inline: GpuType, other: GpuType) -> bool:
    """The same figures; an fp32 / tf32 peak the inline GPU leaves out is not a difference."""
    return _figures(inline) == _figures(other) and all(
        getattr(inline, f) is None or getattr(inline, f) == getattr(other, f) for f in _PRECISION_FIGURES)


def _check_gpu_names(cluster: Cluster, doc: Document, errors: list[InputError]) -> None:
    """One name, one GPU: costs, calibration and profiles are looked up by the GPU's name."""
    seen: dict[str, tuple[GpuType, int]] = {}
    for i, group in enumerate(cluster.nodes):
        gpu, key = group.gpu, group.gpu.name.lower()
        path = ("nodes", i, "gpu")
        catalog_gpu = catalog.find_gpu(gpu.name)
        if catalog_gpu is not None and gpu is not catalog_gpu and not _same_gpu(gpu, catalog_gpu):
            errors.append(doc.error(path, f"the inline GPU is named {gpu.name!r}, which is the catalog's "
                                    f"{catalog_gpu.name} with other figures; use the catalog id alone "
                                    "or give your GPU a name of its own"))
        elif key in seen and not (_same_gpu(gpu, seen[key][0]) and _same_gpu(seen[key][0], gpu)):
            errors.append(doc.error(path, f"two different GPUs are named {gpu.name!r} (the other at "
                                    f"nodes[{seen[key][1]}].gpu); give each its own name"))
        seen.setdefault(key, (gpu, i))


def _check_size(cluster: Cluster, doc: Document, errors: list[InputError]) -> None:
    """Refuse a cluster too large to expand (``count: 1000000000000`` hung validate) before
    anything lists its nodes; each bound is named (planner.spec.limits)."""
    before = len(errors)
    for i, group in enumerate(cluster.nodes):
        if group.gpus_per_node > limits.MAX_GPUS_PER_NODE:
            errors.append(doc.error(("nodes", i, "gpus_per_node"), f"gpus_per_node {group.gpus_per_node:,} is "
                                    f"over the limit of {limits.named('MAX_GPUS_PER_NODE')}"))
    counts = [group.count or 1 for group in cluster.nodes]
    if sum(counts) > limits.MAX_NODES:
        i = max(range(len(counts)), key=counts.__getitem__)       # the group that tips it: the largest
        errors.append(doc.error(("nodes", i, "count"), f"the cluster has {sum(counts):,} nodes, over the "
                                f"limit of {limits.named('MAX_NODES')}"))
    gpus = [c * g.gpus_per_node for c, g in zip(counts, cluster.nodes)]
    if len(errors) == before and sum(gpus) > limits.MAX_GPUS:
        i = max(range(len(gpus)), key=gpus.__getitem__)
        errors.append(doc.error(("nodes", i), f"the cluster has {sum(gpus):,} GPUs, over the limit of "
                                f"{limits.named('MAX_GPUS')}"))
    if len(errors) > before:
        raise InputErrors(errors)


def _check_links(cluster: Cluster, doc: Document, errors: list[InputError]) -> None:
    """A link joins two different zones; between one region and itself it joins that region's
    zones with each other (DESIGN §2), so only a zone repeated is refused."""
    zone_names = {z.name for z in cluster.zones}
    regions = {z.region for z in cluster.zones if z.region}
    for i, link in enumerate(cluster.links):
        a, b = link.between
        if a == b and a in zone_names and a not in regions:
            errors.append(doc.error(("links", i, "between"), f"a link joins two different zones, got "
                                    f"[{a}, {b}]; inside a zone the nodes' own network_bandwidth "
                                    "applies (a region may be linked to itself: its zones with each other)"))


def _cross_check(cluster: Cluster, doc: Document, errors: list[InputError]) -> None:
    _check_gpu_names(cluster, doc, errors)
    _check_links(cluster, doc, errors)
    zone_names = [z.name for z in cluster.zones]
    seen: dict[str, int] = {}
    for i, zone in enumerate(cluster.zones):
        if zone.name in seen:
            errors.append(doc.error(("zones", i, "name"), f"duplicate zone name {zone.name!r}"))
        seen[zone.name] = i
    valid_zones = zone_names or [DEFAULT_ZONE]
    node_names: dict[str, tuple] = {}
    for i, group in enumerate(cluster.nodes):
        if group.zone is not None and group.zone not in valid_zones:
            errors.append(doc.error(("nodes", i, "zone"), f"unknown zone {group.zone!r}; "
                                    f"zones: {', '.join(valid_zones)}"))
        if group.zone is None and len(zone_names) > 1:
            errors.append(doc.error(("nodes", i), "zone is required when the cluster has "
                                    f"several zones ({', '.join(zone_names)})"))
        for name in [group.name, *group.node_names]:
            if name in node_names and node_names[name] != ("nodes", i):
                errors.append(doc.error(("nodes", i, "name"),
                                        f"duplicate node name {name!r} (also at "
                                        f"{doc.locate(node_names[name])})"))
                break
            node_names[name] = ("nodes", i)
    regions = {z.region for z in cluster.zones if z.region}
    pairs: set[frozenset] = set()
    for i, link in enumerate(cluster.links):
        for j, zone in enumerate(link.between):
            if zone not in zone_names and zone not in regions:
                errors.append(doc.error(("links", i, "between", j), f"link to unknown zone or region "
                                        f"{zone!r}; zones: {', '.join(zone_names) or '(none)'}"
                                        + (f"; regions: {', '.join(sorted(regions))}" if regions else "")))
        key = frozenset(link.between)
        if key in pairs:
            errors.append(doc.error(("links", i, "between"), "duplicate link between "
                                    f"{link.between[0]} and {link.between[1]}"))
        pairs.add(key)
        if link.aggregate_bandwidth_Bps is not None and link.aggregate_bandwidth_Bps < link.bandwidth_Bps:
            errors.append(doc.error(("links", i, "aggregate_bandwidth"),
                                    "aggregate_bandwidth must be at least the per-flow bandwidth"))
    typo_in_links = any(z not in zone_names and z not in regions for link in cluster.links for z in link.between)
    used = sorted({cluster.zone_of(g) for g in cluster.nodes})
    for a, b in combinations(used, 2):
        if typo_in_links:
            break  # a link to an unknown zone is most likely the missing one: one message
        if frozenset((a, b)) not in pairs and cluster.link(a, b) is None and a in zone_names and b in zone_names:
            errors.append(doc.error(("links",), f"zones {a!r} and {b!r} both hold nodes but no link "
                                    f"joins them; add e.g. '- {{between: [{a}, {b}], bandwidth: "
                                    "10 Gbit/s, latency: 20 ms}'"))


_INTERNAL_CLUSTER_KEYS = tuple(n for n, f in Cluster.model_fields.items() if f.exclude)
_CLUSTER_KEYS = tuple(sorted(n for n in Cluster.model_fields if n not in _INTERNAL_CLUSTER_KEYS))


def cluster_from_document(doc: Document) -> Cluster:
    if not isinstance(doc.data, dict):
        raise doc.error((), "a cluster spec is a mapping with name, nodes and optionally zones, links")
    errors: list[InputError] = []
    if doc.text:
        # set from the file itself below; a spec that wrote them was taken silently, then overwritten
        errors += [doc.error((key,), f"unknown key {key!r}; valid keys: {', '.join(_CLUSTER_KEYS)}")
                   for key in _INTERNAL_CLUSTER_KEYS if key in doc.data]
    failed = _resolve_gpus(doc, errors)
    try:
        cluster = validate_model(Cluster, doc)
    except InputErrors as exc:
        fresh = [e for e in exc.errors
                 if not (e.location and any((e.location.field or "").startswith(f) for f in failed))]
        raise InputErrors(errors + fresh) from None
    _check_size(cluster, doc, errors)
    _cross_check(cluster, doc, errors)
    cluster = _fill_defaults(cluster, doc, errors)
    if errors:
        raise InputErrors(errors)
    if doc.text:
        cluster = cluster.model_copy(update={"source_sha256": hashlib.sha256(doc.text.encode()).hexdigest(),
                                             "source_file": doc.file})
    return cluster


def load_cluster(path: str | Path) -> Cluster:
    """Read and check a cluster spec; every problem names file:line:column and the field."""
    return cluster_from_document(load_yaml(path))


def cluster_from_dict(data: dict, file: str = "<cluster>") -> Cluster:
    import copy
    return cluster_from_document(document_from_data(copy.deepcopy(data), file))


def load_model(name_or_path: str | Path | dict) -> ModelSpec:
    """A catalog model name, a YAML file with the model mapping, or the mapping itself."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
    if isinstance(name_or_path, dict):
        data = dict(name_or_path)
        if set(data) == {"name"} or (isinstance(data.get("name"), str) and len(data) == 1):
            return catalog.model(data["name"])
        return validate_model(ModelSpec, document_from_data(data, "<model>"))
    text = str(name_or_path)
    found = catalog.find_model(text)
    if found is not None:
        return found
    path = Path(text)
    if not path.exists():
        raise InputError(f"{text!r} is neither a catalog model ({', '.join(catalog.models())}) "
                         "nor a model YAML file")
    doc = load_yaml(path)
    if not isinstance(doc.data, dict):
        raise doc.error((), "a model spec is a mapping (num_layers, hidden_size, ...)")
    data = dict(doc.data)
    data.setdefault("name", path.stem)
    return validate_model(ModelSpec, doc, data=data)


def load_training(path: str | Path) -> Training:
    doc = load_yaml(path)
    if not isinstance(doc.data, dict):
        raise doc.error((), "a training spec is a mapping (global_batch_size, seq_len, ...)")
    return validate_model(Training, doc)
