"""Built-in data: GPU types and model shapes, each number with its source.

The data live in ``gpus.yaml`` and ``models.yaml`` beside this file; this module only loads
them and looks names up (case-insensitively, aliases included).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from planner.errors import InputError
from planner.spec.gpu import GpuType
from planner.spec.model import ModelSpec
from planner.spec.source import load_yaml, validate_model

_HERE = Path(__file__).parent


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


@lru_cache(maxsize=1)
def gpus() -> dict[str, GpuType]:
    """Catalog GPU types by id, in file order."""
    doc = load_yaml(_HERE / "gpus.yaml")
    out: dict[str, GpuType] = {}
    for i, entry in enumerate(doc.data["gpus"]):
        entry = {("name" if k == "id" else k): v for k, v in entry.items()}
        gpu = validate_model(GpuType, doc, ("gpus", i), data=entry)
        out[gpu.name] = gpu
    return out


@lru_cache(maxsize=1)
def models() -> dict[str, ModelSpec]:
    doc = load_yaml(_HERE / "models.yaml")
    out: dict[str, ModelSpec] = {}
    for i, entry in enumerate(doc.data["models"]):
        entry = {("name" if k == "id" else k): v for k, v in entry.items()}
        model = validate_model(ModelSpec, doc, ("models", i), data=entry)
        out[model.name] = model
    return out


@lru_cache(maxsize=1)
def _gpu_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for gid, gpu in gpus().items():
        for name in (gid, *gpu.aliases):
            index[_key(name)] = gid
    return index


@lru_cache(maxsize=1)
def _model_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for mid, model in models().items():
        for name in (mid, *model.aliases):
            index[_key(name)] = mid
    return index


def find_gpu(name: str) -> GpuType | None:
    gid = _gpu_index().get(_key(name))
    return gpus()[gid] if gid else None


def nearest_gpus(name: str, most: int = 3) -> list[str]:
    """Catalog ids a mistyped or short GPU name likely meant: those whose id or an alias holds
    it ("H100" -> the H100s), else the closest spellings (difflib)."""
    import difflib

    key, index = _key(name), _gpu_index()
    holding = list(dict.fromkeys(gid for alias, gid in index.items() if key and key in alias))
    if holding:
        return holding[:most]
    close = difflib.get_close_matches(key, list(index), n=most, cutoff=0.6)
    return list(dict.fromkeys(index[c] for c in close))


def unknown_gpu_hint(name: str) -> str:
    """" (did you mean A or B?)" for ``nearest_gpus``, or nothing."""
    near = nearest_gpus(name)
    return f" (did you mean {' or '.join(near)}?)" if near else ""


def find_model(name: str) -> ModelSpec | None:
    mid = _model_index().get(_key(name))
    return models()[mid] if mid else None


def gpu(name: str) -> GpuType:
    found = find_gpu(name)
    if found is None:
        raise InputError(f"unknown GPU type {name!r}{unknown_gpu_hint(name)}; catalog ids: {', '.join(gpus())}")
    return found


def model(name: str) -> ModelSpec:
    found = find_model(name)
    if found is None:
        raise InputError(f"unknown model {name!r}; catalog models: {', '.join(models())}")
    return found
