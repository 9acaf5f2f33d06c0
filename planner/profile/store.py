"""Measured profiles as the cost model reads them: ``ProfileSet.lookup``.

A lookup answers with the measured forward and backward time of one layer on one GPU type, or
``None`` so that the cost model falls back to its roofline.  Only files whose ``dtype`` is the
plan's training precision answer, or files that say they stand in for it (``stands_in_for``):
a layer timed in fp32 is not a bf16 layer.  In order:
1. an exact entry (same GPU type, layer kind, micro-batch, tp, seq_len and layer shape);
2. linear interpolation between the two nearest measured micro-batch sizes around the one asked
   for (same everything else; entries that did not fit are not used);
3. 1 and 2 over the entries of files of another dtype that stand in for the plan's precision;
4. ``None``; when a file of another dtype would have answered, the usage record says so.
A block also carries how its attention core ran (the file's ``attention``): within a dtype the
files of the plan's kernel answer first, then those of the other kernel, whose answer the cost
model re-prices for the plan's kernel (``attention_of`` says which answered; planner.cost.compute).
We do not extrapolate beyond the measured range: below the smallest micro-batch fixed
per-kernel costs dominate and above the largest the device may run out of memory or change
kernels, so a straight line would be a guess dressed as a measurement; the roofline,
calibrated with ``planner profile --calibrate``, is the better-founded guess there.

Every lookup is recorded as measured, interpolated or estimated (a miss); ``usage()`` sums them
up for the plan's ``inputs.profiles``, with the reason for a miss that a dtype caused and, per
file, why it was skipped.

Reading one profile file (``parse_profile``, ``profile_gpu_type``, ``gpu_type_for_device``,
``gpu_key``, ``LoadedProfile`` and the path expansion) moved to ``planner.profile.files``; the
names other modules import from here still resolve here.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from planner.errors import InputError, Location
from planner.profile.files import (
    LoadedProfile,
    expand_paths,
    gpu_key,
    parse_profile,
    profile_gpu_type,
)
from planner.profile.schema import Dtype, layer_shape
from planner.spec.source import Document, load_yaml

DTYPES: tuple[str, ...] = get_args(Dtype)

def _model_mapping(model: Any) -> dict:
    if hasattr(model, "to_mapping"):
        return model.to_mapping()
    from planner.spec import load_model  # a name or a mapping; rare, so resolved lazily
    return load_model(model).to_mapping()


@dataclass
class _Point:
    micro_batch: int
    forward_s: float
    backward_s: float
    stands_in_for: tuple[str, ...] = ()  # the file's: other precisions it may price
    weight_fraction: float | None = None  # W / (I + W) where the split backward was measured
    attention: str = "fused"  # the file's: how a block's attention core ran


@dataclass
class _Series:
    """The fitting points of one (GPU type, layer, tp, seq_len, shape, dtype), sorted by
    micro-batch."""

    points: list[_Point] = field(default_factory=list)
    origin: dict[int, str] = field(default_factory=dict)  # micro-batch -> file (for conflicts)

    def add(self, point: _Point, path: str, where: Location) -> None:
        if point.micro_batch in self.origin:
            raise InputError(f"this entry was already measured in {self.origin[point.micro_batch]}; "
                             "keep one profile per GPU type, layer shape and seq_len", where)
        self.origin[point.micro_batch] = path
        keys = [p.micro_batch for p in self.points]
        self.points.insert(bisect.bisect(keys, point.micro_batch), point)


class ProfileSet:
    """Measured per-layer costs of one or more GPU types (see the module docstring)."""

    def __init__(self, profiles: Iterable[LoadedProfile] = ()):
        self.profiles: list[LoadedProfile] = []
        self._series: dict[tuple, _Series] = {}
        self._usage: dict[tuple, str] = {}
        # Per recorded lookup: the dtype of a stand-in file that answered, or why none did.
        self._notes: dict[tuple, dict[str, str]] = {}
        self._precisions: set[str] = set()  # plan precisions looked up since the last reset
        for loaded in profiles:
            self.add(loaded)

    # ------------------------------------------------------------------ building
    def add(self, loaded: LoadedProfile, doc: Document | None = None) -> None:
        prof = loaded.profile
        model = prof.model.model_dump()
        for i, e in enumerate(prof.entries):
            if not e.fits:
                continue
            key = (gpu_key(loaded.gpu_type), e.layer, e.tp, prof.seq_len,
                   layer_shape(model, e.layer), prof.dtype, _kernel(e.layer, prof.attention))
            where = doc.locate(("entries", i)) if doc else Location(loaded.path, field=f"entries[{i}]")
            self._series.setdefault(key, _Series()).add(
                _Point(e.micro_batch, e.forward_s, e.backward_s, prof.stands_in_for, e.weight_fraction,
                       prof.attention),
                loaded.path, where)
        self.profiles.append(loaded)

    @classmethod
    def load(cls, paths: str | Path | Iterable[str | Path], gpu_type: str | None = None) -> ProfileSet:
        """Profile files, or directories of them (``*.yaml``, ``*.yml``), in sorted order."""
        out = cls()
        for path in expand_paths(paths):
            out._load_file(path, gpu_type)
        return out

    @classmethod
    def from_cluster(cls, cluster, cluster_path: str | Path | None = None) -> ProfileSet:
        """The files of a cluster spec's ``profiles:`` mapping (GPU type -> file), paths relative
        to the spec file.  The mapping's key is the GPU type the file's entries count for."""
        out = cls()
        out._add_cluster(cluster, cluster_path)
        return out

    def _add_cluster(self, cluster, cluster_path: str | Path | None) -> None:
        cluster_path = cluster_path or getattr(cluster, "source_file", None)
        base = Path(cluster_path).parent if cluster_path else Path.cwd()
        spec_doc = None
        if cluster_path and Path(cluster_path).is_file():
            spec_doc = load_yaml(cluster_path)
        known = {gpu_key(n.gpu.name) for n in cluster.node_list}
        for gpu_name, rel in sorted(cluster.profiles.items()):
            def where(name=gpu_name) -> Location:
                if spec_doc is not None:
                    return spec_doc.locate(("profiles", name))
                return Location(str(cluster_path or "<cluster>"), field=f"profiles.{name}")
            if gpu_key(gpu_name) not in known:
                raise InputError(f"no node of this cluster has GPU type {gpu_name!r}; node GPU types: "
                                 f"{', '.join(sorted({n.gpu.name for n in cluster.node_list}))}",
                                 where())
            path = Path(rel) if Path(rel).is_absolute() else Path(os.path.normpath(base / rel))
            if path.is_dir():
                # "not found" misled: the folder is there, but a mapping entry names one file
                raise InputError(f"{path} is a folder, not a profile file: profiles: maps each GPU type "
                                 "to one profile file (give a folder of profiles with --profiles)", where())
            if not path.is_file():
                raise InputError(f"profile file not found: {path}", where())
            self._load_file(path, gpu_name)

    def _load_file(self, path: Path, gpu_type: str | None) -> None:
        # The same file named twice (a --profiles folder and the cluster's mapping) counts once.
        if any(Path(p.path).resolve() == path.resolve() and (gpu_type is None or
               gpu_key(gpu_type) == gpu_key(p.gpu_type)) for p in self.profiles):
            return
        doc = load_yaml(path)
        profile = parse_profile(doc)
        resolved = gpu_type or profile_gpu_type(profile, doc)
        self.add(LoadedProfile(str(path), resolved, profile), doc)

    # ------------------------------------------------------------------ reading
    @property
    def gpu_types(self) -> list[str]:
        return sorted({p.gpu_type for p in self.profiles})

    # The cost model checks these before passing ``precision`` / ``attention`` (its minimal
    # protocol has neither).
    matches_precision = True
    matches_attention = True

    def lookup(self, gpu_name: str, layer_kind: str, micro_batch: int, tp: int, seq_len: int,
               model: Any, precision: str | None = None, attention: str | None = None
               ) -> tuple[float, float] | None:
        """(forward_s, backward_s) of one micro-batch on one TP rank, or None (use the roofline).

        ``precision``: the plan's training precision; only files of that dtype, or standing in
        for it, answer.  None (callers that predate dtypes) takes a file of any dtype.
        ``attention``: the plan's attention kernel (fused | unfused); a block timed with the
        other one still answers, after those of the plan's, and ``attention_of`` names it."""
        mapping = _model_mapping(model)
        base = (gpu_key(gpu_name), layer_kind, tp, seq_len, layer_shape(mapping, layer_kind))
        record = (gpu_name, layer_kind, micro_batch, tp, seq_len)
        dtypes = self._dtypes(base)
        if precision is not None:
            self._precisions.add(precision)
        result, source, note = None, "estimated", {}
        for dtype, points in self._candidates(base, dtypes, precision, attention):
            result, source = _interpolate(points, micro_batch)
            if result is not None:
                if precision is not None and dtype != precision:
                    note["profile_dtype"] = dtype
                if attention is not None and points[0].attention != attention and layer_kind == "block":
                    note["profile_attention"] = points[0].attention
                break
        if result is None and precision is not None:
            for dtype in (d for d in dtypes if d != precision):
                if any(_interpolate(pts, micro_batch)[0] is not None for pts in self._kernels(base, dtype, None)):
                    note = {"reason": f"profile dtype {dtype} != plan precision {precision}"}
                    break
        self._usage[record] = source
        if note:
            self._notes[record] = note
        else:
            self._notes.pop(record, None)
        return result

    def attention_of(self, gpu_name: str, layer_kind: str, micro_batch: int, tp: int, seq_len: int) -> str | None:
        """The attention kernel of the file that answered the last lookup of this entry when it
        is not the plan's (the cost model then re-prices the core); None otherwise."""
        return self._notes.get((gpu_name, layer_kind, micro_batch, tp, seq_len), {}).get("profile_attention")

    def _dtypes(self, base: tuple) -> list[str]:
        """The dtypes measured for one (GPU type, layer, tp, seq_len, shape), in DTYPES order:
        a few dictionary probes per lookup (lookups run for every option the search prices)."""
        return [d for d in DTYPES if any((*base, d, k) in self._series for k in _KERNELS)]

    def _kernels(self, base: tuple, dtype: str, attention: str | None) -> list[list[_Point]]:
        """The point lists of one dtype, the plan's attention kernel first (a block's files may
        have timed either; other layers have one list)."""
        kinds = [k for k in _KERNELS if (*base, dtype, k) in self._series]
        if attention in kinds:
            kinds.remove(attention)
            kinds.insert(0, attention)
        return [self._series[(*base, dtype, k)].points for k in kinds]

    def _candidates(self, base: tuple, dtypes: list[str], precision: str | None, attention: str | None):
        """(dtype, points) in the order lookups take them: the plan's dtype (any dtype when
        None), then the files of other dtypes standing in for it; within each, the plan's
        attention kernel first."""
        if precision is None or precision in dtypes:
            own = precision if precision is not None else (dtypes[0] if dtypes else None)
            if own is not None:
                for points in self._kernels(base, own, attention):
                    yield own, points
        if precision is not None:
            for dtype in (d for d in dtypes if d != precision):
                for points in self._kernels(base, dtype, attention):
                    standing = [p for p in points if precision in p.stands_in_for]
                    if standing:
                        yield dtype, standing

    def weight_fraction(self, gpu_name: str, layer_kind: str, micro_batch: int, tp: int, seq_len: int,
                        model: Any, precision: str | None = None, attention: str | None = None) -> float | None:
        """W's measured share of the backward, W / (I + W), from the points ``lookup`` would use
        (interpolated between measured micro-batches as ``lookup`` does); None when those points
        were not measured split (older profiles), so the cost model uses the FLOPs split.  Records
        no usage: the ``lookup`` of the same layer does."""
        base = (gpu_key(gpu_name), layer_kind, tp, seq_len, layer_shape(_model_mapping(model), layer_kind))
        dtypes = self._dtypes(base)
        for _, points in self._candidates(base, dtypes, precision, attention):
            if _interpolate(points, micro_batch)[0] is not None:   # the series lookup answers from
                return _interpolate_fraction(points, micro_batch)
        return None

    def source_of(self, gpu_name: str, layer_kind: str, micro_batch: int, tp: int, seq_len: int) -> str:
        """How the last lookup of this entry was answered: measured, interpolated or estimated."""
        return self._usage.get((gpu_name, layer_kind, micro_batch, tp, seq_len), "estimated")

    def skipped(self, precision: str) -> list[tuple[str, str]]:
        """(path, reason) of each file a plan trained in ``precision`` cannot use."""
        return [(p.path, f"profile dtype {p.profile.dtype} != plan precision {precision}")
                for p in sorted(self.profiles, key=lambda p: p.path) if not p.profile.serves(precision)]

    def usage(self) -> dict:
        """What the lookups so far found, for the plan's ``inputs.profiles`` (sorted, stable).

        A lookup that a file of another dtype would have answered carries a ``reason``; one a
        stand-in file answered carries that file's ``profile_dtype``.  A file that a looked-up
        precision cannot use carries ``skipped`` (why)."""
        counts = {"measured": 0, "interpolated": 0, "estimated": 0}
        lookups = []
        for record, source in sorted(self._usage.items()):
            gpu, layer, mb, tp, seq = record
            counts[source] += 1
            lookups.append({"gpu_type": gpu, "layer": layer, "micro_batch": mb, "tp": tp,
                            "seq_len": seq, "source": source, **self._notes.get(record, {})})
        skipped: dict[str, list[str]] = {}
        for precision in sorted(self._precisions):
            for path, reason in self.skipped(precision):
                skipped.setdefault(path, []).append(reason)
        files = []
        for p in sorted(self.profiles, key=lambda p: p.path):
            row = {"path": p.path, "gpu_type": p.gpu_type, "device": p.profile.device.name,
                   "dtype": p.profile.dtype, "created": p.profile.created}
            if p.profile.stands_in_for:
                row["stands_in_for"] = list(p.profile.stands_in_for)
            if p.path in skipped:
                row["skipped"] = "; ".join(skipped[p.path])
            files.append(row)
        return {"files": files, **counts, "lookups": lookups}

    def reset_usage(self) -> None:
        """Forget recorded lookups (e.g. after a search, before evaluating the chosen plan)."""
        self._usage.clear()
        self._notes.clear()
        self._precisions.clear()


_KERNELS = ("fused", "unfused", "-")


def _kernel(layer: str, attention: str) -> str:
    """A series' attention kernel: a block's file's; "-" for layers without attention."""
    return attention if layer == "block" else "-"


def _interpolate(points: list[_Point], micro_batch: int) -> tuple[tuple[float, float] | None, str]:
    keys = [p.micro_batch for p in points]
    i = bisect.bisect_left(keys, micro_batch)
    if i < len(points) and keys[i] == micro_batch:
        return (points[i].forward_s, points[i].backward_s), "measured"
    if 0 < i < len(points):
        lo, hi = points[i - 1], points[i]
        w = (micro_batch - lo.micro_batch) / (hi.micro_batch - lo.micro_batch)
        return ((lo.forward_s + w * (hi.forward_s - lo.forward_s),
                 lo.backward_s + w * (hi.backward_s - lo.backward_s)), "interpolated")
    return None, "estimated"


def _interpolate_fraction(points: list[_Point], micro_batch: int) -> float | None:
    keys = [p.micro_batch for p in points]
    i = bisect.bisect_left(keys, micro_batch)
    if i < len(points) and keys[i] == micro_batch:
        return points[i].weight_fraction
    lo, hi = points[i - 1], points[i]  # the caller checked micro_batch lies between two points
    if lo.weight_fraction is None or hi.weight_fraction is None:
        return None
    w = (micro_batch - lo.micro_batch) / (hi.micro_batch - lo.micro_batch)
    return lo.weight_fraction + w * (hi.weight_fraction - lo.weight_fraction)


def load_profiles(dir_or_files: str | Path | Iterable[str | Path] | None = None, cluster=None,
                  cluster_path: str | Path | None = None) -> ProfileSet | None:
    """Profiles for the ``--profiles`` flag and a cluster's ``profiles:`` mapping together;
    None when neither names any file (the cost model then uses the roofline throughout)."""
    has_cluster = cluster is not None and bool(getattr(cluster, "profiles", None))
    if dir_or_files is None and not has_cluster:
        return None
    out = ProfileSet.load(dir_or_files) if dir_or_files is not None else ProfileSet()
    if has_cluster:
        out._add_cluster(cluster, cluster_path)
    return out
