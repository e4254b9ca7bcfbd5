"""A generic codec for message dataclasses: fields travel as a msgpack array in field order.

Supported field types: int, float, str, bool, bytes, None-unions, list/tuple of those, and
nested dataclasses. A field named ``records`` (bytes) is carried as the frame's raw payload
instead of inside the msgpack body, so record batches are never copied into msgpack.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

PAYLOAD_FIELD = "records"

T = TypeVar("T")


class DecodeError(ValueError):
    """A body that does not match the message's declared shape."""


_FIELDS: dict[type, tuple[tuple[str, Any], ...]] = {}


def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    found = _FIELDS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        found = tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))
        _FIELDS[cls] = found
    return found


def _to_wire(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [_to_wire(getattr(value, name)) for name, _ in _fields(type(value))]
    if isinstance(value, list | tuple):
        return [_to_wire(v) for v in value]
    return value


def encode(message: Any) -> tuple[list[Any], bytes | memoryview]:
    """Return (body, payload) for a message dataclass."""
    body: list[Any] = []
    payload: bytes | memoryview = b""
    for name, _ in _fields(type(message)):
        value = getattr(message, name)
        if name == PAYLOAD_FIELD:
            payload = value
            body.append(None)
        else:
            body.append(_to_wire(value))
    return body, payload


def _from_wire(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _from_wire(arg, value, where)
            except DecodeError as exc:
                errors.append(str(exc))
        raise DecodeError(f"{where}: no alternative of {tp} matches ({'; '.join(errors)})")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise DecodeError(f"{where}: expected a list, got {type(value).__name__}")
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise DecodeError(f"{where}: expected {len(args)} items, got {len(value)}")
            return tuple(_from_wire(a, v, where) for a, v in zip(args, value, strict=True))
        item = args[0] if args else Any
        items = [_from_wire(item, v, where) for v in value]
        return items if origin is list else tuple(items)
    if dataclasses.is_dataclass(tp):
        return decode_body(typing.cast(type, tp), value)
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise DecodeError(f"{where}: expected float, got {type(value).__name__}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise DecodeError(f"{where}: expected int, got {type(value).__name__}")
    if tp is bytes:
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        raise DecodeError(f"{where}: expected bytes, got {type(value).__name__}")
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise DecodeError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
    raise DecodeError(f"{where}: unsupported field type {tp}")


def decode_body(cls: type[T], body: Any, payload: bytes | memoryview = b"") -> T:
    """Build ``cls`` from a decoded msgpack body (and the frame payload for ``records``)."""
    fields = _fields(cls)
    if not isinstance(body, list) or len(body) != len(fields):
        raise DecodeError(
            f"{cls.__name__}: expected {len(fields)} fields, got "
            f"{len(body) if isinstance(body, list) else type(body).__name__}"
        )
    kwargs: dict[str, Any] = {}
    for (name, tp), value in zip(fields, body, strict=True):
        if name == PAYLOAD_FIELD:
            kwargs[name] = payload if isinstance(payload, bytes) else bytes(payload)
        else:
            kwargs[name] = _from_wire(tp, value, f"{cls.__name__}.{name}")
    return cls(**kwargs)
