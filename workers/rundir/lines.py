"""A typed line of a run directory's JSON files: a frozen dataclass written by `to_json` and
read back by `from_json`, which checks each field against its type (records.py has
the kinds)."""

from __future__ import annotations

import io
import json
import math
import numbers
import time
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, fields
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar, Union

if TYPE_CHECKING:
    from typing import Self

L = TypeVar("L", bound="Line")


def now_s() -> float:
    return round(time.time(), 3)


@dataclass(frozen=True, kw_only=True)
class Line:
    """One JSON object of a run directory file, typed."""

    def to_json(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_json(cls, obj: object, **given: object) -> Self:
        """The line `obj` (parsed JSON) holds, with the fields `given` by the reader;
        Malformed if a field is missing or of the wrong type."""
        if not isinstance(obj, dict):
            raise Malformed(f"{cls.__name__}: not a JSON object")
        values = given
        for name, convert, required in _readers(cls):
            if name in given:
                continue
            if name in obj:
                try:
                    values[name] = convert(obj[name])
                except Malformed as err:
                    raise Malformed(f"{cls.__name__}.{name}: {err}") from None
            elif required:
                raise Malformed(f"{cls.__name__}: no {name}")
        try:
            return cls(**values)
        except ValueError as err:  # a check of the type's own (Request: an unknown action)
            raise Malformed(str(err)) from None


def iter_jsonl(data: bytes) -> Iterator[dict | None]:
    """Each non-empty line of JSON-lines `data` as its JSON object, or None where it is not one
    (a torn line, garbage, another JSON value), one line at a time: a file of millions of
    lines is never held as millions of objects at once."""
    for line in io.BytesIO(data):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError; too deep
            obj = None
        yield obj if isinstance(obj, dict) else None


def parse_jsonl(data: bytes) -> tuple[list[dict], int]:
    """The JSON objects of JSON-lines `data`, and how many non-empty lines were skipped (a
    torn line, garbage, a JSON value that is not an object)."""
    objects, skipped = [], 0
    for obj in iter_jsonl(data):
        if obj is None:
            skipped += 1
        else:
            objects.append(obj)
    return objects, skipped


def parse_lines(data: bytes, line_type: type[L]) -> tuple[list[L], int]:
    """The `line_type` lines of JSON-lines `data` (requests, knob changes), and how many lines
    were damaged (torn, not JSON, not such a line)."""
    objects, skipped = parse_jsonl(data)
    lines = []
    for obj in objects:
        try:
            lines.append(line_type.from_json(obj))
        except Malformed:
            skipped += 1
    return lines, skipped


def damaged_lines(count: int) -> str:
    return f"{count} damaged line{'s' * (count != 1)} (torn, or not a record)"


class Malformed(ValueError):
    """A JSON object that is not a record of its kind (a field missing or of the wrong type)."""


@cache
def _readers(cls: type) -> list[tuple[str, Callable[[object], object], bool]]:
    """(name, converter, required) of each field of a Line type, worked out once per type."""
    hints = typing.get_type_hints(cls)
    return [
        (f.name, _converter(hints[f.name]), f.default is MISSING and f.default_factory is MISSING)
        for f in fields(cls)
    ]


@cache
def _converter(hint: Any) -> Callable[[object], object]:
    """A function that returns a value parsed from JSON as the type `hint` says, or raises
    Malformed: a float may be null (written for a value that was not finite: NaN), dict keys
    are strings in JSON (int keys are converted back)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return lambda value: value
    if origin in (Union, types.UnionType):
        nullable = type(None) in args
        options = [_converter(a) for a in args if a is not type(None)]

        def union(value: object) -> object:
            if value is None and nullable:
                return None
            for option in options:
                try:
                    return option(value)
                except Malformed:
                    pass
            raise Malformed(f"{value!r} is not {hint}")

        return union
    if hint is float:
        return _float
    if hint is int:
        return _int
    if hint in (str, bool):
        return lambda value: value if type(value) is hint else _wrong(value, hint)
    if origin is tuple:
        item = _converter(args[0])
        return lambda value: (
            tuple(item(v) for v in value) if isinstance(value, list) else _wrong(value, hint)
        )
    if origin is dict:
        key, item = (_int_key if args[0] is int else _converter(args[0])), _converter(args[1])
        return lambda value: (
            {key(k): item(v) for k, v in value.items()}
            if isinstance(value, dict)
            else _wrong(value, hint)
        )
    raise TypeError(f"no reading from JSON for {hint}")  # a new field of a type not handled


def _wrong(value: object, hint: Any) -> typing.NoReturn:
    raise Malformed(f"{value!r} is not {hint}")


def _float(value: object) -> float:
    if value is None:
        return math.nan  # written for a value that was not finite
    return float(value) if is_number(value) else _wrong(value, float)


def _int(value: object) -> int:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    return int(value) if ok else _wrong(value, int)


def _int_key(key: object) -> int:
    try:
        return int(key)  # JSON object keys are strings
    except (TypeError, ValueError):
        return _wrong(key, int)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _plain(value: object) -> object:
    """A JSON-safe value: non-finite floats become None, tensors and numpy scalars plain
    numbers, tuples lists (dict keys become strings in JSON by themselves)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):  # a dict, or KnobValues
        return {k: _plain(v) for k, v in value.items()}
    return value
