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
# message class from its type hints, into the class's generated decoder (interpreting
# the hints for every value of every message cost more than the rest of a replica's
# handling of a fetch).
_Decoder = Callable[[Any, str], Any]


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
    """Per field: (name, whether its value needs _to_wire: only a type that can hold a
    dataclass does; scalars and lists of scalars go to msgpack as they are)."""
    return tuple((name, _may_hold_dataclass(tp)) for name, tp in _fields(cls))


def _to_wire(value: Any) -> Any:
    known = _WIRE.get(type(value))
    if known is not None:
        return known(value)[0]
    if isinstance(value, list | tuple):
        return [_to_wire(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _wire_encoder(type(value))(value)[0]
    return value


def encode(message: Any) -> tuple[list[Any], bytes | memoryview]:
    """Return (body, payload) for a message dataclass."""
    body, payload = _wire_encoder(type(message))(message)
    return body, payload


_WIRE: dict[type, Callable[[Any], tuple[list[Any], Any]]] = {}


def _wire_encoder(cls: type) -> Callable[[Any], tuple[list[Any], Any]]:
    """(body, payload) of a ``cls`` as one generated function: the fields in order, those
    that may hold a dataclass through ``_to_wire``, ``records`` as the payload."""
    found = _WIRE.get(cls)
    if found is not None:
        return found
    items = []
    payload = "b''"
    for name, deep in _encoders(cls):
        if name == PAYLOAD_FIELD:
            items.append("None")
            payload = f"m.{name}"
        else:
            items.append(f"to_wire(m.{name})" if deep else f"m.{name}")
    env: dict[str, Any] = {"to_wire": _to_wire}
    source = f"def wire(m):\n    return [{', '.join(items)}], {payload}"
    exec(source, env)  # noqa: S102 - source built from the class's own field names
    wire: Callable[[Any], tuple[list[Any], Any]] = env["wire"]
    _WIRE[cls] = wire
    return wire


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
        exact = args[0] if args and args[0] in _EXACT else None

        def items(value: Any, where: str) -> Any:
            check(value, where)
            if exact is not None:
                # Items of exactly the type are the values (as _compile's in-line test):
                # only a list holding another type goes through the item decoder.
                for v in value:
                    if type(v) is not exact:
                        break
                else:
                    return make(value)
            return make(value if item is _as_is else [item(v, where) for v in value])

        return items
    if dataclasses.is_dataclass(tp):
        cls = typing.cast(type, tp)

        def nested(value: Any, where: str) -> Any:
            decode = _COMPILED.get(cls)
            if decode is None:
                decode = _COMPILED[cls] = _compile(cls)
            return decode(value, b"")

        return nested
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
    return tuple((name, f"{cls.__name__}.{name}", _decoder(tp)) for name, tp in _fields(cls))


def decode_body(cls: type[T], body: Any, payload: bytes | memoryview = b"") -> T:
    """Build ``cls`` from a decoded msgpack body (and the frame payload for ``records``)."""
    decode = _COMPILED.get(cls)
    if decode is None:
        decode = _COMPILED[cls] = _compile(cls)
    message: T = decode(body, payload)
    return message


_COMPILED: dict[type, Callable[[Any, bytes | memoryview], Any]] = {}

# Field types whose wire value is already the value when its type is exactly the one
# named (msgpack makes exactly these): the compiled decoder checks ``type(v) is t`` in
# line and calls the field's decoder only otherwise (to convert or to raise).
_EXACT: dict[Any, str] = {int: "int", str: "str", bool: "bool", bytes: "bytes", float: "float"}


def _compile(cls: type) -> Callable[[Any, bytes | memoryview], Any]:
    """A decoder of ``cls`` as one generated function: fields unpacked from the body, each
    checked in line where a type test suffices, ``cls`` built by ``positional``. The same
    checks and errors as the field decoders, without a call per field."""
    decoders = _decoders(cls)
    n = len(decoders)
    env: dict[str, Any] = {"wrong_shape": lambda body: _wrong_shape(cls, n, body)}
    hints = dict(_fields(cls))
    lines = [
        "def decode(body, payload):",
        f"    if type(body) is not list or len(body) != {n}:",
        "        raise wrong_shape(body)",
    ]
    for i, (name, where, decoder) in enumerate(decoders):
        v = f"v{i}"
        env[f"d{i}"] = decoder
        env[f"w{i}"] = where
        lines.append(f"    {v} = body[{i}]")
        tp = hints[name]
        exact = _EXACT.get(tp)
        optional = _optional_of(tp)
        if name == PAYLOAD_FIELD:
            lines.append(f"    {v} = payload if type(payload) is bytes else bytes(payload)")
        elif exact is not None:
            lines.append(f"    if type({v}) is not {exact}:")
            lines.append(f"        {v} = d{i}({v}, w{i})")
        elif optional is not None:
            lines.append(f"    if {v} is not None and type({v}) is not {optional}:")
            lines.append(f"        {v} = d{i}({v}, w{i})")
        else:
            lines.append(f"    {v} = d{i}({v}, w{i})")
    env["build"] = positional(cls)
    lines.append(f"    return build({', '.join(f'v{i}' for i in range(n))})")
    exec("\n".join(lines), env)  # noqa: S102 - source built from the class's own fields
    decode: Callable[[Any, bytes | memoryview], Any] = env["decode"]
    return decode


def _slot_setters(cls: type) -> list[Callable[[Any, Any], None]] | None:
    """The slot descriptors' setters of ``cls``'s fields in order, when building it from
    them is what its ``__init__`` does: a slotted dataclass whose fields are all set by
    ``__init__``, without ``__post_init__``. Otherwise None (build it with keywords)."""
    if hasattr(cls, "__post_init__") or not all(f.init for f in dataclasses.fields(cls)):
        return None
    setters = []
    for name, _ in _fields(cls):
        slot = cls.__dict__.get(name)
        if slot is None:  # an inherited field: its slot lives on the base that declares it
            slot = next((b.__dict__[name] for b in cls.__mro__ if name in b.__dict__), None)
        if type(slot) is not types.MemberDescriptorType:
            return None
        setters.append(slot.__set__)
    return setters


_POSITIONAL: dict[type, Callable[..., Any]] = {}


def positional(cls: type[T]) -> Callable[..., T]:
    """A builder of ``cls`` from its field values in declaration order (no keywords), for
    messages built by the thousand (a Metadata answer's partitions): its slots set as the
    compiled decoder sets them, or its ``__init__`` where that is not possible."""
    found = _POSITIONAL.get(cls)
    if found is not None:
        return found
    names = [name for name, _ in _fields(cls)]
    setters = _slot_setters(cls)
    args = ", ".join(f"v{i}" for i in range(len(names)))
    env: dict[str, Any] = {"cls": cls, "new": object.__new__}
    if setters is None:
        body = f"    return cls({', '.join(f'{n}=v{i}' for i, n in enumerate(names))})"
    else:
        env.update({f"s{i}": setter for i, setter in enumerate(setters)})
        sets = "".join(f"    s{i}(o, v{i})\n" for i in range(len(names)))
        body = f"    o = new(cls)\n{sets}    return o"
    exec(f"def build({args}):\n{body}", env)  # noqa: S102 - from the class's own fields
    build: Callable[..., T] = env["build"]
    _POSITIONAL[cls] = build
    return build


def _optional_of(tp: Any) -> str | None:
    """``"int"`` for ``int | None`` (and likewise for the other exact types), else None."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return None
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) != 1 or len(args) == len(typing.get_args(tp)):
        return None
    return _EXACT.get(args[0])


def _wrong_shape(cls: type, n: int, body: Any) -> DecodeError:
    return DecodeError(
        f"{cls.__name__}: expected {n} fields, got "
        f"{len(body) if isinstance(body, list) else type(body).__name__}"
    )
