"""``plan --schedule / --recompute / --zero-stage / --context-parallel``: the training file's
freedoms as flags.

Each flag takes one choice or several separated by commas and narrows the search to them, as
``schedules:``, ``recompute_modes:`` and ``zero_stages:`` do in a training file.  A flag that
contradicts what the file itself sets is an input error, as ``--precision`` is."""

from __future__ import annotations

from planner.api import Training, training_from_mapping
from planner.errors import InputError, InputErrors, Location

# flag -> the training field it sets
FLAGS = {"--schedule": "schedules", "--recompute": "recompute_modes", "--zero-stage": "zero_stages",
         "--context-parallel": "context_parallel_degrees", "--expert-parallel": "expert_parallel_degrees",
         "--zero-shard-degree": "zero_shard_degrees"}


def _choices(flag: str, text: str) -> tuple:
    values = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not values:
        raise InputError(f"{flag} {text!r}: give one or more choices separated by commas")
    if flag == "--zero-stage":
        if not all(v.isdigit() for v in values):
            raise InputError(f"{flag} {text!r}: give ZeRO stages 0 to 3, e.g. 1 or 0,1,3")
        return tuple(int(v) for v in values)
    if flag == "--zero-shard-degree":   # HSDP group sizes, or "all" (shard over every replica)
        if not all(v in ("all", "node") or (v.isdigit() and int(v) >= 1) for v in values):
            raise InputError(f"{flag} {text!r}: give shard-group sizes of 1 or more replicas, all or node, "
                             "e.g. all,node,4")
        return tuple(v if v in ("all", "node") else int(v) for v in values)
    if flag in ("--context-parallel", "--expert-parallel"):
        kind = flag.removeprefix("--")
        if not all(v.isdigit() and int(v) >= 1 for v in values):
            raise InputError(f"{flag} {text!r}: give {kind} degrees of 1 or more, e.g. 1,2,4")
        return tuple(int(v) for v in values)
    return values


def with_freedoms(training: Training, flags: dict[str, str | None], training_path: str | None) -> Training:
    """``training`` narrowed by the flags given (flag -> its text, None when absent)."""
    update = {}
    for flag, text in flags.items():
        if text is None:
            continue
        field = FLAGS[flag]
        values = _choices(flag, text)
        if training_path and field in training.model_fields_set and set(values) != set(getattr(training, field)):
            raise InputError(f"{flag} {text} contradicts {field}: {list(getattr(training, field))} in "
                             f"{training_path}; set it in the file (or drop {flag})")
        update[field] = values
    if not update:
        return training
    data = {**training.model_dump(exclude_unset=True), **update}
    # the field's own check names what is valid (e.g. schedules: 'gpipe', '1f1b', ...)
    given = [f for f in flags if flags[f]]
    try:
        return training_from_mapping(data, file=" / ".join(given))
    except InputErrors as exc:
        # an error on one flag's field names that flag alone: "--recompute / --context-parallel:
        # context_parallel_degrees: ..." sent the user to --recompute too
        raise InputErrors([_on_flag(e, given) for e in exc.errors]) from None


def _on_flag(error: InputError, given: list[str]) -> InputError:
    where = error.location
    root = (where.field or "").split(".")[0].split("[")[0] if where else ""
    flag = next((f for f in given if FLAGS.get(f) == root), None)
    return InputError(error.message, Location(flag, field=where.field)) if flag else error
