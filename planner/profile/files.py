"""Profile files one at a time: checking a document (``parse_profile``), the GPU type it counts
for (``profile_gpu_type``, ``gpu_type_for_device``, ``gpu_key``) and the files a ``--profiles``
argument names (``expand_paths``).

Apart from ``planner.profile.store`` because other readers need a checked file without the
lookup index: ``planner.profile.calibrate`` and ``planner.cost.device_report`` read profiles
one by one, and ``planner.profile.measure`` names the GPU it measured on.  No torch here, as
in the store (tests/test_profile_store.py checks that reading profiles never imports it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from planner import catalog
from planner.errors import InputError
from planner.profile.schema import MEMORY_NOT_MEASURED, SCHEMA_ID, ProfileFile
from planner.spec.source import Document, validate_model

# Vendor prefixes torch puts before the product name; stripped when the full name is no alias.
_DEVICE_PREFIXES = ("NVIDIA GeForce ", "NVIDIA ", "Tesla ", "AMD Instinct ", "AMD ")


def gpu_type_for_device(device_name: str) -> str | None:
    """The catalog id a device name (as torch reports it) maps to, or None."""
    found = catalog.find_gpu(device_name)
    if found is None:
        for prefix in _DEVICE_PREFIXES:
            if device_name.startswith(prefix):
                found = catalog.find_gpu(device_name[len(prefix):])
                if found is not None:
                    break
    return found.name if found else None


def gpu_key(name: str) -> str:
    """One spelling per GPU type: the catalog id through its aliases, else the name itself."""
    found = catalog.find_gpu(name)
    return (found.name if found else name.strip()).lower()


@dataclass(frozen=True)
class LoadedProfile:
    path: str
    gpu_type: str  # as the user spells it (catalog id or inline name)
    profile: ProfileFile


def expand_paths(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Profile files, or directories of them (``*.yaml``, ``*.yml``, sorted), as a list of files."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = sorted([*p.glob("*.yaml"), *p.glob("*.yml")])
            if not found:
                raise InputError(f"no profile files (*.yaml) in directory {p}")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise InputError(f"profile file or directory not found: {p}")
    return out


def parse_profile(doc: Document) -> ProfileFile:
    """Check a profile document; every problem names file:line:column and the field."""
    if not isinstance(doc.data, dict):
        raise doc.error((), f"a profile is a mapping with 'schema: {SCHEMA_ID}', device, entries, ...")
    schema = doc.data.get("schema")
    if schema is None:
        raise doc.error((), f"missing required field 'schema' (this planner reads '{SCHEMA_ID}')")
    if schema != SCHEMA_ID:
        raise doc.error(("schema",), f"unsupported profile schema {schema!r}; this planner reads "
                        f"'{SCHEMA_ID}' (re-run 'planner profile' to write one)")
    settings = doc.data.get("settings")
    no_memory = isinstance(settings, dict) and settings.get("memory") == MEMORY_NOT_MEASURED
    return validate_model(ProfileFile, doc, context={MEMORY_NOT_MEASURED: no_memory})


def profile_gpu_type(profile: ProfileFile, doc: Document) -> str:
    """The GPU type a profile counts for: its ``device.gpu_type``, else its device name through
    the catalog; CPU profiles default to the pseudo type ``cpu``."""
    if profile.device.gpu_type:
        return profile.device.gpu_type
    if profile.device.kind == "cpu":
        return "cpu"
    found = gpu_type_for_device(profile.device.name)
    if found is None:
        raise doc.error(("device", "name"), f"device {profile.device.name!r} matches no catalog GPU "
                        "type; add 'gpu_type:' under device (a catalog id such as A100-SXM4-80GB, "
                        "or the name of an inline GPU in your cluster), or pass --gpu-type")
    return found
