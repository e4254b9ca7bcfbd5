"""A generic codec for message dataclasses: fields travel as a msgpack array in field order.

Supported field types: int, float, str, bool, bytes, None-unions, list/tuple of those, and
nested dataclasses. A field named ``records`` (bytes) is carried as the frame's raw payload
instead of inside the msgpack body, so record batches are never copied into msgpack.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

PAYLOAD_FIELD = "records"

T = TypeVar("T")


class DecodeError(ValueError):
    """A body that does not match the message's declared shape."""


_FIELDS: dict[type, tuple[tuple[str, Any], ...]] = {}

# A field's decoder: (wire value, where) -> value, raising DecodeError. Built once per
# message class from its type hints (interpreting the hints for every value of every
# message cost more than the rest of a replica's handling of a fetch).
_Decoder = Callable[[Any, str], Any]
_DECODERS: dict[type, tuple[tuple[str, str, _Decoder], ...]] = {}
# Per class: (field name, whether its value needs _to_wire: only a type that can hold a
# dataclass does; scalars and lists of scalars go to msgpack as they are).
_ENCODERS: dict[type, tuple[tuple[str, bool], ...]] = {}


def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    found = _FIELDS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        found = tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))
        _FIELDS[cls] = found
    return found


def _may_hold_dataclass(tp: Any) -> bool:
    """Whether a value of ``tp`` may hold a dataclass to convert (``object`` is an opaque
    value already in wire form, such as a RaftEnvelope's encoded body)."""
    if tp is object:
        return False
    if tp is Any or dataclasses.is_dataclass(tp):
        return True
    return any(_may_hold_dataclass(a) for a in typing.get_args(tp) if a is not Ellipsis)


def _encoders(cls: type) -> tuple[tuple[str, bool], ...]:
    found = _ENCODERS.get(cls)
    if found is None:
        found = tuple((name, _may_hold_dataclass(tp)) for name, tp in _fields(cls))
        _ENCODERS[cls] = found
    return found


def _to_wire(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [
            _to_wire(getattr(value, name)) if deep else getattr(value, name)
            for name, deep in _encoders(type(value))
        ]
    if isinstance(value, list | tuple):
        return [_to_wire(v) for v in value]
    return value


def encode(message: Any) -> tuple[list[Any], bytes | memoryview]:
    """Return (body, payload) for a message dataclass."""
    body: list[Any] = []
    payload: bytes | memoryview = b""
    for name, deep in _encoders(type(message)):
        value = getattr(message, name)
        if name == PAYLOAD_FIELD:
            payload = value
            body.append(None)
        else:
            body.append(_to_wire(value) if deep else value)
    return body, payload


def _as_is(value: Any, where: str) -> Any:
    return value


def _decoder(tp: Any) -> _Decoder:
    """The decoder of wire values of type ``tp``: int, float, str, bool, bytes, None
    unions, lists and tuples of those, nested dataclasses; ``object`` passes as it is."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return _as_is
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        nullable = type(None) in args
        alternatives = [_decoder(a) for a in args if a is not type(None)]

        def union(value: Any, where: str) -> Any:
            if value is None and nullable:
                return None
            errors = []
            for decode in alternatives:
                try:
                    return decode(value, where)
                except DecodeError as exc:
                    errors.append(str(exc))
            raise DecodeError(f"{where}: no alternative of {tp} matches ({'; '.join(errors)})")

        return union
    if origin in (list, tuple):
        args = typing.get_args(tp)

        def check(value: Any, where: str) -> None:
            if not isinstance(value, list | tuple):
                raise DecodeError(f"{where}: expected a list, got {type(value).__name__}")

        if origin is tuple and args and args[-1] is not Ellipsis:
            parts = [_decoder(a) for a in args]

            def fixed(value: Any, where: str) -> Any:
                check(value, where)
                if len(parts) != len(value):
                    raise DecodeError(f"{where}: expected {len(parts)} items, got {len(value)}")
                return tuple(d(v, where) for d, v in zip(parts, value, strict=True))

            return fixed
        item = _decoder(args[0] if args else Any)
        make = list if origin is list else tuple

        def items(value: Any, where: str) -> Any:
            check(value, where)
            return make(value if item is _as_is else [item(v, where) for v in value])

        return items
    if dataclasses.is_dataclass(tp):
        cls = typing.cast(type, tp)
        return lambda value, where: decode_body(cls, value)
    if tp is float:

        def real(value: Any, where: str) -> Any:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
            raise DecodeError(f"{where}: expected float, got {type(value).__name__}")

        return real
    if tp is int:

        def integer(value: Any, where: str) -> Any:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise DecodeError(f"{where}: expected int, got {type(value).__name__}")

        return integer
    if tp is bytes:

        def binary(value: Any, where: str) -> Any:
            if isinstance(value, bytes | bytearray | memoryview):
                return bytes(value)
            raise DecodeError(f"{where}: expected bytes, got {type(value).__name__}")

        return binary
    if isinstance(tp, type):
        expected = tp

        def instance(value: Any, where: str) -> Any:
            if isinstance(value, expected):
                return value
            raise DecodeError(f"{where}: expected {expected.__name__}, got {type(value).__name__}")

        return instance

    def unsupported(value: Any, where: str) -> Any:
        raise DecodeError(f"{where}: unsupported field type {tp}")

    return unsupported


def _decoders(cls: type) -> tuple[tuple[str, str, _Decoder], ...]:
    found = _DECODERS.get(cls)
    if found is None:
        found = tuple((name, f"{cls.__name__}.{name}", _decoder(tp)) for name, tp in _fields(cls))
        _DECODERS[cls] = found
    return found


def decode_body(cls: type[T], body: Any, payload: bytes | memoryview = b"") -> T:
    """Build ``cls`` from a decoded msgpack body (and the frame payload for ``records``)."""
    decoders = _decoders(cls)
    if not isinstance(body, list) or len(body) != len(decoders):
        raise DecodeError(
            f"{cls.__name__}: expected {len(decoders)} fields, got "
            f"{len(body) if isinstance(body, list) else type(body).__name__}"
        )
    kwargs: dict[str, Any] = {}
    for (name, where, decode), value in zip(decoders, body, strict=True):
        if name == PAYLOAD_FIELD:
            kwargs[name] = payload if isinstance(payload, bytes) else bytes(payload)
        else:
            kwargs[name] = decode(value, where)
    return cls(**kwargs)
