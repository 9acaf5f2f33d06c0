"""The Python API's argument checks (planner.api): each public function takes its arguments
through these, so a wrong argument is an ``InputError`` (exit 2 in the CLI) naming the
parameter and what it may be, not an AttributeError or TypeError from deep inside.

What each kind of argument may be:

- a cluster: a ``Cluster``, the path of a cluster spec (YAML), or the spec as a mapping
  (``planner.spec.cluster_from_dict``: errors name ``<cluster>`` and the field);
- a model: a ``ModelSpec``, a catalog name, the path of a model YAML, or a mapping;
- training: a ``Training`` or a mapping of its fields (errors name ``<training>`` and the field);
- a plan: a ``Plan`` or the path of a plan file;
- profiles: a ``ProfileSet``, a profile file or folder, a list of those, or None.

Kept light: nothing here imports the search, the cost model or torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.plan import Plan
from planner.spec import Cluster, ModelSpec, Training

PathLike = (str, Path)


def shown(value: Any) -> str:
    """``value`` for a message: its type and a short repr."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return text if value is None else f"{type(value).__name__} {text}"


def _is_path(value: Any) -> bool:
    """A ``pathlib.Path``, or a ``str`` that is not blank."""
    return isinstance(value, Path) or (isinstance(value, str) and bool(value.strip()))


def path_arg(value: Any, param: str, what: str = "file") -> str | Path:
    """A path (``str`` or ``pathlib.Path``, not empty)."""
    if _is_path(value):
        return value
    raise InputError(f"{param} must be the path of a {what} (a str or pathlib.Path), got {shown(value)}")


def optional_path_arg(value: Any, param: str, what: str = "file") -> str | Path | None:
    return None if value is None else path_arg(value, param, what)


def cluster_arg(value: Any, param: str = "cluster") -> Cluster:
    if isinstance(value, Cluster):
        return value
    if isinstance(value, Mapping):
        from planner.spec import cluster_from_dict

        return cluster_from_dict(dict(value), file="<cluster>")
    if _is_path(value):
        from planner.spec import load_cluster

        return load_cluster(value)
    raise InputError(f"{param} must be a Cluster, the path of a cluster spec (YAML) or the spec as "
                     f"a mapping (name, nodes, ...), got {shown(value)}")


def model_arg(value: Any, param: str = "model") -> ModelSpec:
    if isinstance(value, ModelSpec):
        return value
    if isinstance(value, Mapping):
        name = value.get("name")
        if "name" in value and not isinstance(name, str):
            raise InputError(f"<model>: name: a model's name is a string (a catalog model's, or "
                             f"your own), got {shown(name)}")
    elif not _is_path(value):
        from planner import catalog

        raise InputError(f"{param} must be a ModelSpec, a catalog model name ({', '.join(catalog.models())}), "
                         f"the path of a model YAML or a mapping (num_layers, hidden_size, ...), got {shown(value)}")
    from planner.spec import load_model

    return load_model(dict(value) if isinstance(value, Mapping) else value)


def training_arg(value: Any, param: str = "training") -> Training:
    if isinstance(value, Training):
        return value
    if isinstance(value, Mapping):
        return training_from_fields(dict(value), "<training>")
    raise InputError(f"{param} must be a Training (api.training(global_batch_size=..., seq_len=...)) "
                     f"or a mapping of its fields, got {shown(value)}")


def training_from_fields(data: Any, file: str) -> Training:
    """A ``Training`` from a mapping, its errors naming ``file`` and the field."""
    from planner.spec.source import document_from_data, validate_model

    return validate_model(Training, document_from_data(data, file=file))


def plan_arg(value: Any, param: str = "plan", file: str = "<plan>") -> tuple[Plan, str]:
    """(the plan, the name its errors use): a path given names itself unless ``file`` does."""
    if isinstance(value, Plan):
        return value, file
    if _is_path(value):
        from planner.plan.check import load_plan

        return load_plan(value), (str(value) if file == "<plan>" else file)
    raise InputError(f"{param} must be a Plan (api.load_plan) or the path of a plan file, got {shown(value)}")


def profiles_arg(value: Any, param: str = "profiles") -> Any:
    """``value`` unchanged when it is one of: None, a ``ProfileSet``, a path, a list of paths."""
    if value is None or isinstance(value, PathLike):
        return value
    from planner.profile.store import ProfileSet

    if isinstance(value, ProfileSet):
        return value
    if isinstance(value, Iterable) and not isinstance(value, (Mapping, bytes)):
        items = list(value)
        if items and all(isinstance(v, PathLike) for v in items):
            return items
    raise InputError(f"{param} must be a ProfileSet, the path of a profile file or folder, a list of "
                     f"profile files, or None (the cluster spec's profiles:), got {shown(value)}")


def whole_number(value: Any, param: str, optional: bool = False) -> Any:
    """An ``int`` (not a bool); the callee checks the range."""
    if (optional and value is None) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise InputError(f"{param} must be a whole number (int){' or None' if optional else ''}, got {shown(value)}")


def real_number(value: Any, param: str, what: str = "number", optional: bool = False) -> Any:
    """An ``int`` or ``float`` (not a bool); the callee checks the range."""
    if (optional and value is None) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise InputError(f"{param} must be a {what}{' or None' if optional else ''}, got {shown(value)}")


def flag(value: Any, param: str, optional: bool = False) -> Any:
    """``True`` or ``False``: a truthy stand-in ('yes', 1) would be taken without a word."""
    if (optional and value is None) or isinstance(value, bool):
        return value
    raise InputError(f"{param} must be True or False{' or None' if optional else ''}, got {shown(value)}")


def text_arg(value: Any, param: str, what: str, optional: bool = False) -> Any:
    """A ``str``; the callee checks its content."""
    if (optional and value is None) or isinstance(value, str):
        return value
    raise InputError(f"{param} must be {what} (a str){' or None' if optional else ''}, got {shown(value)}")


def training_choice(value: Any, param: str) -> Any:
    """A value of the ``Training`` field ``param`` (precision, cross_entropy, elementwise),
    checked by the field's own type, as a plan file's ``inputs.training`` is: the choices
    are listed once, in planner.spec.training."""
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(Training.model_fields[param].annotation).validate_python(value, strict=True)
    except ValidationError as exc:
        raise InputError(f"{param}: {exc.errors()[0]['msg']}, got {shown(value)}") from None


def plans_arg(value: Any, param: str) -> list[Plan]:
    """A list of plans, each a ``Plan`` or the path of a plan file."""
    if isinstance(value, (Plan, Mapping, bytes, *PathLike)) or not isinstance(value, Iterable):
        raise InputError(f"{param} must be a list of Plans (api.load_plan) or plan file paths, "
                         f"got {shown(value)}")
    return [plan_arg(v, f"{param}[{i}]")[0] for i, v in enumerate(value)]


def callable_arg(value: Any, param: str, what: str) -> Callable | None:
    if value is None or callable(value):
        return value
    raise InputError(f"{param} must be {what} or None, got {shown(value)}")


def check_options(function: str, options: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """Python's own TypeError for a keyword ``function`` does not take, naming the public
    function (not the internal one the options are passed on to) and the valid ones."""
    valid = sorted(set(allowed))
    for name in options:
        if name not in valid:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}; "
                            f"its options: {', '.join(valid)}")


def parameters(function: Callable, skip: int = 0) -> list[str]:
    """The keyword names ``function`` takes, less its first ``skip`` parameters."""
    params = list(inspect.signature(function).parameters.values())[skip:]
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
