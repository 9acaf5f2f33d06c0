"""YAML documents that remember where each value came from.

PyYAML's composer keeps a mark (line, column) on every node; we build plain Python data from
the node tree and keep a map from field path to mark, so that any later check (pydantic's or
our own cross-field ones) can name ``file:line:column`` and the field path.  Duplicate keys,
which PyYAML silently overwrites, are caught here.  Merge keys (``<<: *defaults``) are resolved
here too, so that a merged-in field keeps the line that wrote it.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from planner.errors import InputError, InputErrors, Location
from planner.spec import limits

PathKey = tuple[str | int, ...]


class FieldValueError(ValueError):
    """A cross-field check's failure that belongs to one field: raised in a pydantic
    ``model_validator``, it is reported at that field's line and path, not at the mapping's
    first line (``num_attention_heads (3) must divide hidden_size`` pointed at line 1 with no
    field, leaving the user to find which of the shape's numbers was wrong)."""

    def __init__(self, field_name: str | tuple[str | int, ...], message: str):
        super().__init__(message)
        self.field_name = field_name        # a name, or a path into the mapping: ("entries", 3)


def format_field_path(path: PathKey) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


@dataclass
class Document:
    """Plain data read from one file plus the position of every value in it."""

    file: str
    data: Any
    text: str = ""
    marks: dict[PathKey, tuple[int, int]] = field(default_factory=dict)

    def locate(self, path: PathKey) -> Location:
        """The location of ``path``, or of its nearest ancestor that the file spells out."""
        probe = tuple(path)
        while probe and probe not in self.marks:
            probe = probe[:-1]
        line, column = self.marks.get(probe, (None, None))
        return Location(self.file, line, column, format_field_path(tuple(path)) or None)

    def error(self, path: PathKey, message: str) -> InputError:
        return InputError(message, self.locate(path))


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's composer recurses once per level of nesting: 5,000 nested lists took over a
    second to overflow Python's stack.  Refuse at ``MAX_NESTING_DEPTH`` instead, at the line
    where the file crosses it."""

    def __init__(self, stream, file: str):
        super().__init__(stream)
        self.file = file
        self.depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > limits.MAX_NESTING_DEPTH:
                mark = self.peek_event().start_mark
                raise InputError("lists and mappings nested too deeply: beyond the limit of "
                                 f"{limits.named('MAX_NESTING_DEPTH')}; no spec is shaped so",
                                 Location(self.file, mark.line + 1, mark.column + 1))
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Builder:
    def __init__(self, file: str, loader: yaml.SafeLoader):
        self.file = file
        self.loader = loader
        self.marks: dict[PathKey, tuple[int, int]] = {}
        self.errors: list[InputError] = []
        # an anchored mapping is built again for each alias or merge of it: its errors, already
        # reported at the anchor, would come again at the same line and column
        self._reported: set[tuple] = set()
        # PyYAML's composer shares an anchored node between its aliases; building plain data
        # copies it once per alias, which is where an alias bomb explodes.  Count those copies.
        self.built: set[int] = set()
        self.alias_values = 0

    def _check_bounds(self, node: yaml.Node, path: PathKey, repeated: bool) -> None:
        if repeated:
            self.alias_values += 1
            if self.alias_values > limits.MAX_ALIAS_VALUES:
                raise InputError("YAML aliases (*name) expand to more values than the limit of "
                                 f"{limits.named('MAX_ALIAS_VALUES')}; write the values out or "
                                 "nest fewer aliases", self._where(node, path))

    def _report(self, error: InputError) -> None:
        """Keep ``error`` unless one with its message, line and column is already kept."""
        where = error.location
        key = (error.message, where.line if where else None, where.column if where else None)
        if key not in self._reported:
            self._reported.add(key)
            self.errors.append(error)

    def _where(self, node: yaml.Node, path: PathKey) -> Location:
        return Location(self.file, node.start_mark.line + 1, node.start_mark.column + 1,
                        format_field_path(path) or None)

    def build(self, node: yaml.Node, path: PathKey, repeated: bool = False) -> Any:
        repeated = repeated or id(node) in self.built
        self.built.add(id(node))
        self._check_bounds(node, path, repeated)
        self.marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if isinstance(node, yaml.MappingNode):
            return self._build_mapping(node, path, repeated)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,), repeated) for i, item in enumerate(node.value)]
        value = self.loader.construct_object(node, deep=True)
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            self._report(InputError(
                f"{node.value!r} is not a finite number",
                Location(self.file, *self.marks[path], format_field_path(path) or None)))
        return value

    def _build_mapping(self, node: yaml.MappingNode, path: PathKey, repeated: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        key_marks: dict[str, tuple[int, int]] = {}
        merges: list[yaml.Node] = []
        for key_node, value_node in node.value:
            where = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            # SafeConstructor knows ``<<`` only through flatten_mapping, which we bypass to keep
            # each field's mark; constructing it as a key fails with "no constructor for merge"
            is_merge = key_node.tag == _MERGE_TAG
            key = "<<" if is_merge else self.loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                self._report(InputError(
                    f"keys must be strings, got {key!r}",
                    Location(self.file, *where, format_field_path(path) or None)))
                continue
            key = str(key)
            if key in key_marks:
                first = key_marks[key]
                self._report(InputError(
                    f"duplicate key {key!r} (first given at line {first[0]})",
                    Location(self.file, *where, format_field_path(path + (key,)))))
                continue
            key_marks[key] = where
            if is_merge:
                merges.extend(self._merge_sources(value_node, path))
            else:
                out[key] = self.build(value_node, path + (key,), repeated)
        for source in merges:
            self._merge(out, source, path, repeated)
        return out

    def _merge_sources(self, node: yaml.Node, path: PathKey) -> list[yaml.MappingNode]:
        """The mappings a ``<<`` key merges, first-listed first (it wins, per the YAML spec)."""
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        wrong = next((source for source in sources if not isinstance(source, yaml.MappingNode)), None)
        if wrong is None:
            return sources
        self._report(InputError(
            "a merge key (<<) takes a mapping, e.g. '<<: *defaults', or a list of them",
            self._where(wrong, path + ("<<",))))
        return []

    def _merge(self, out: dict[str, Any], source: yaml.MappingNode, path: PathKey,
               repeated: bool) -> None:
        """Add the keys of ``source`` that ``out`` lacks; each keeps the mark of the line that
        wrote it (in the anchored mapping), not that of the ``<<``."""
        outer_marks, self.marks = self.marks, {}
        try:
            merged = self.build(source, path, repeated)
        finally:
            source_marks, self.marks = self.marks, outer_marks
        taken = {key for key in merged if key not in out}
        for key in taken:
            out[key] = merged[key]
        depth = len(path)
        for at, mark in source_marks.items():
            if len(at) > depth and at[depth] in taken:
                self.marks[at] = mark


def read_text(path: str | Path, what: str = "file") -> str:
    """A file's text; a missing, unreadable or oversized file is an ``InputError`` naming it."""
    try:
        size_bytes = Path(path).stat().st_size
        if size_bytes > limits.MAX_FILE_BYTES:
            raise InputError(f"{what} is {size_bytes:,} bytes, over the limit of "
                             f"{limits.named('MAX_FILE_BYTES')}", Location(str(path), 1))
        return Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"{what} not found: {path}") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {what} {path}: {exc}") from None


def _loader(text: str, file: str) -> _BoundedLoader:
    """PyYAML checks the whole text for characters YAML forbids as it builds the loader, and
    says where by character offset only: translate that to line and column."""
    try:
        return _BoundedLoader(text, file)
    except yaml.reader.ReaderError as exc:
        raise InputError(_forbidden_character(exc.character),
                         _text_location(file, text, exc.position)) from None


def _forbidden_character(code: int) -> str:
    kind = "control character" if unicodedata.category(chr(code)) == "Cc" else "character"
    hint = " (is this a binary file?)" if code == 0 else ""
    return (f"{kind} U+{code:04X} is not allowed in YAML{hint}; delete it, or inside a "
            f"double-quoted string write it as the escape \\u{code:04X}")


# what PyYAML's reader counts as a line break (Reader.forward): "\r\n" is one, at its "\n"
_LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")


def _text_location(file: str, text: str, position: int) -> Location:
    """Line and column of character ``position`` as PyYAML's marks count them, so that it
    agrees with the lines of its own errors: a line ends at "\n", "\r" (alone or before "\n"),
    U+0085, U+2028 or U+2029, and a byte order mark (U+FEFF) takes no column."""
    line, line_start = 1, 0
    for match in _LINE_BREAK.finditer(text, 0, position):
        if match.group() == "\r" and text.startswith("\n", match.end()):
            continue   # the "\r" of a "\r\n" cut at ``position``: the line ends at the "\n"
        line, line_start = line + 1, match.end()
    column = position - line_start - text.count("\ufeff", line_start, position) + 1
    return Location(file, line, column)


def load_yaml(path: str | Path, text: str | None = None) -> Document:
    """Read a YAML file into a ``Document``; syntax errors become ``InputError``."""
    file = str(path)
    if text is None:
        text = read_text(path)
    loader = _loader(text, file)
    try:
        node = loader.get_single_node()
        if node is None:
            raise InputError("the file is empty", Location(file, 1))
        builder = _Builder(file, loader)
        data = builder.build(node, ())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        loc = Location(file, mark.line + 1, mark.column + 1) if mark else Location(file, 1)
        raise InputError(f"YAML syntax: {exc.problem or exc.context}", loc) from None
    except yaml.YAMLError as exc:
        raise InputError(f"YAML syntax: {exc}", Location(file, 1)) from None
    except RecursionError:
        # _BoundedLoader stops nesting well before Python's stack does; should a future PyYAML
        # recurse elsewhere, a file nested thousands deep is still a bad file, not a bug
        raise InputError("nested too deeply to be a spec (lists and mappings inside each other "
                         f"beyond the limit of {limits.named('MAX_NESTING_DEPTH')})",
                         Location(file, 1)) from None
    finally:
        loader.dispose()
    if builder.errors:
        raise InputErrors(builder.errors)
    return Document(file=file, data=data, text=text, marks=builder.marks)


def document_from_data(data: Any, file: str = "<data>") -> Document:
    """A ``Document`` for data built in code (no positions, field paths only)."""
    return Document(file=file, data=data)


def _describe(model: type[BaseModel], loc: tuple) -> str:
    """Names of the fields valid at ``loc`` inside ``model``, for 'unknown key' errors."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or current is None:
            continue
        fields = getattr(current, "model_fields", {})
        match = next((f for n, f in fields.items() if (f.alias or n) == part), None)
        current = _inner_model(match.annotation) if match else None
    if current is None or not hasattr(current, "model_fields"):
        return ""
    # fields excluded from dumps are set by the loader, not written by users
    names = sorted((f.alias or n) for n, f in current.model_fields.items() if not f.exclude)
    return "; valid keys: " + ", ".join(names)


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def validate_model(model: type[BaseModel], doc: Document, path: PathKey = (), data: Any = None,
                   context: dict | None = None):
    """Validate ``data`` (default: the document's) into ``model``; errors name file:line:col."""
    payload = doc.data if data is None else data
    try:
        return model.model_validate(payload, context=context)
    except ValidationError as exc:
        errors = []
        raw = exc.errors()
        for err in raw:
            # A failed item also makes its container look "too short"; report the item only.
            if err["type"] == "too_short" and any(
                    len(o["loc"]) > len(err["loc"]) and o["loc"][:len(err["loc"])] == err["loc"] for o in raw):
                continue
            loc = path + tuple(err["loc"])
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, FieldValueError):
                loc += cause.field_name if isinstance(cause.field_name, tuple) else (cause.field_name,)
            msg = err["msg"]
            msg = msg.removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = f"unknown key {loc[-1]!r}" + _describe(model, tuple(err["loc"]))
            elif err["type"] == "missing":
                msg = f"missing required field {loc[-1]!r}"
            elif err["type"] in ("literal_error", "enum"):
                msg = f"{msg}, got {err.get('input')!r}"
            elif err["type"] in ("tuple_type", "list_type") and isinstance(err.get("input"), (str, int, float)):
                # pydantic says "Input should be a valid tuple": a user wrote one value for a list
                msg = f"expected a list, e.g. [{err['input']}, ...], got the single value {err['input']!r}"
            errors.append(InputError(msg, doc.locate(loc)))
        raise InputErrors(errors) from None
