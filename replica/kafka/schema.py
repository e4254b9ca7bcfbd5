"""Schema-driven Kafka messages: fields with version ranges, encoded classic or flexible.

A message schema is a tuple of :class:`F` (transcribed from Kafka's JSON message
definitions, see ``messages.py``). A message value is a plain ``dict`` keyed by the
fields' snake_case names; structs are dicts, arrays lists. Decoding fills the fields a
version lacks with their defaults, so ``decode(encode(m)) == m`` for a complete ``m``.
Encoding drops fields the version lacks (Kafka's generated code would raise for a
non-default, non-ignorable one; a server answering an old client wants them dropped).

Per (fields, version, flexible) a *plan* is compiled once and cached.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .wire import KafkaDecodeError, Reader, Writer

__all__ = [
    "Api",
    "F",
    "Message",
    "VersionRange",
    "decode_struct",
    "default_message",
    "encode_struct",
    "plan_for",
]

Message = dict[str, Any]
_ZERO_UUID = uuid.UUID(int=0)


class VersionRange(NamedTuple):
    """Kafka's version-range strings: "3+", "0-4", "7", "none"."""

    low: int
    high: int  # inclusive; a large number for "N+"

    @classmethod
    def parse(cls, text: str) -> VersionRange:
        if text == "none":
            return cls(1, 0)
        if text.endswith("+"):
            return cls(int(text[:-1]), 1 << 15)
        low, _, high = text.partition("-")
        return cls(int(low), int(high or low))

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.low <= version <= self.high


@dataclass(frozen=True)
class F:
    """One field. ``type``: "int8" "int16" "int32" "int64" "uint16" "float64" "bool" "uuid"
    "string" "bytes" "records", "[]<primitive>", or "[]" / "{}" (array of / one struct of
    ``fields``). ``versions``/``nullable``/``tagged`` are Kafka version-range strings."""

    name: str
    type: str
    versions: str
    nullable: str = "none"
    tag: int | None = None
    tagged: str = "none"
    default: Any = field(default=..., compare=False)
    fields: tuple[F, ...] = ()


@dataclass(frozen=True, eq=False)
class Api:
    """A request/response pair with the versions we serve (``min_version``..``max_version``)."""

    key: int
    name: str
    min_version: int
    max_version: int
    flexible: str
    request: tuple[F, ...]
    response: tuple[F, ...]

    def is_flexible(self, version: int) -> bool:
        return version in VersionRange.parse(self.flexible)

    def plan(self, version: int, request: bool) -> _Plan:
        """The compiled plan of the request (or response) at ``version``, cached."""
        return _api_plan(self, version, request)

    def default_request(self, version: int) -> Message:
        return default_message(self.request, version, self.is_flexible(version))

    def default_response(self, version: int) -> Message:
        return default_message(self.response, version, self.is_flexible(version))

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def request_header_version(self, version: int) -> int:
        return 2 if self.is_flexible(version) else 1

    def response_header_version(self, version: int) -> int:
        # ApiVersionsResponse always uses header v0 so that a client that sent a version
        # we do not know can still read our answer (KIP-511).
        if self.key == 18:
            return 0
        return 1 if self.is_flexible(version) else 0


@functools.cache
def _api_plan(api: Api, version: int, request: bool) -> _Plan:
    # Api hashes by identity (eq=False), so this cache costs no tuple hashing per call.
    return plan_for(api.request if request else api.response, version, api.is_flexible(version))


class _Slot(NamedTuple):
    """One field compiled for one version."""

    name: str
    kind: str  # a primitive type name, or "struct"
    nullable: bool
    array: bool
    sub: _Plan | None
    default: Any


class _Plan(NamedTuple):
    flexible: bool
    regular: tuple[_Slot, ...]
    tagged: tuple[tuple[int, _Slot], ...]
    absent: tuple[_Slot, ...]


def _default_value(f: F, version: int, flexible: bool) -> Any:
    if f.default is not ...:
        return f.default
    if f.type.startswith("["):
        return []
    if f.type == "{}":
        return default_message(f.fields, version, flexible)
    return {
        "int8": 0,
        "int16": 0,
        "int32": 0,
        "int64": 0,
        "uint16": 0,
        "float64": 0.0,
        "bool": False,
        "uuid": _ZERO_UUID,
        "string": "",
        "bytes": b"",
        "records": None,
    }[f.type]


@functools.cache
def plan_for(fields: tuple[F, ...], version: int, flexible: bool) -> _Plan:
    regular: list[_Slot] = []
    tagged: list[tuple[int, _Slot]] = []
    absent: list[_Slot] = []
    for f in fields:
        present = version in VersionRange.parse(f.versions)
        is_array = f.type.startswith("[]")
        elem = f.type[2:] if is_array else f.type
        sub = None
        if f.fields:
            sub = plan_for(f.fields, version, flexible)
            kind = "struct"
        else:
            kind = elem
        slot = _Slot(
            f.name,
            kind,
            version in VersionRange.parse(f.nullable),
            is_array,
            sub,
            _default_value(f, version, flexible),
        )
        if not present:
            absent.append(slot)
        elif f.tag is not None and flexible and version in VersionRange.parse(f.tagged):
            tagged.append((f.tag, slot))
        else:
            regular.append(slot)
    return _Plan(flexible, tuple(regular), tuple(tagged), tuple(absent))


def default_message(fields: tuple[F, ...], version: int, flexible: bool) -> Message:
    """Every field of the version at its default (fill in what you need, then encode)."""
    plan = plan_for(fields, version, flexible)
    out: Message = {}
    for slot in (*plan.regular, *(s for _, s in plan.tagged), *plan.absent):
        out[slot.name] = _copy_default(slot.default)
    return out


def _copy_default(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy_default(v) for k, v in value.items()}
    if isinstance(value, list):
        return list(value)
    return value


# --- decoding ---------------------------------------------------------------------------


def _read_scalar(r: Reader, kind: str, nullable: bool, compact: bool) -> Any:
    if kind == "int32":
        return r.int32()
    if kind == "int16":
        return r.int16()
    if kind == "int64":
        return r.int64()
    if kind == "string":
        return r.nullable_string(compact) if nullable else r.string(compact)
    if kind == "int8":
        return r.int8()
    if kind == "bool":
        return r.boolean()
    if kind == "bytes":
        return r.nullable_bytes(compact) if nullable else r.bytes_(compact)
    if kind == "records":
        return r.nullable_bytes(compact) if nullable else r.bytes_(compact)
    if kind == "uuid":
        return r.uuid()
    if kind == "uint16":
        return r.uint16()
    if kind == "float64":
        return r.float64()
    raise AssertionError(f"unknown field type {kind}")


def _read_slot(r: Reader, slot: _Slot, compact: bool) -> Any:
    if slot.array:
        n = r.array_length(compact, slot.nullable)
        if n < 0:
            return None
        if slot.sub is not None:
            sub = slot.sub
            return [decode_struct(r, sub) for _ in range(n)]
        kind = slot.kind
        return [_read_scalar(r, kind, False, compact) for _ in range(n)]
    if slot.sub is not None:
        if slot.nullable and r.int8() < 0:
            return None
        return decode_struct(r, slot.sub)
    return _read_scalar(r, slot.kind, slot.nullable, compact)


def decode_struct(r: Reader, plan: _Plan) -> Message:
    out: Message = {}
    compact = plan.flexible
    for slot in plan.regular:
        out[slot.name] = _read_slot(r, slot, compact)
    for slot in plan.absent:
        out[slot.name] = _copy_default(slot.default)
    if compact:
        raw = r.skip_tagged_fields()
        for tag, slot in plan.tagged:
            data = raw.get(tag)
            if data is None:
                out[slot.name] = _copy_default(slot.default)
                continue
            sub = Reader(data)
            out[slot.name] = _read_slot(sub, slot, compact)
            if sub.remaining:
                raise KafkaDecodeError(f"tagged field {slot.name} has {sub.remaining} extra bytes")
    return out


# --- encoding ---------------------------------------------------------------------------


def _write_scalar(w: Writer, kind: str, nullable: bool, compact: bool, v: Any, name: str) -> None:
    if v is None and not (nullable and kind in ("string", "bytes", "records")):
        raise ValueError(f"field {name!r} is not nullable in this version")
    if kind == "int32":
        w.int32(v)
    elif kind == "int16":
        w.int16(v)
    elif kind == "int64":
        w.int64(v)
    elif kind == "string":
        w.nullable_string(v, compact)
    elif kind == "int8":
        w.int8(v)
    elif kind == "bool":
        w.boolean(v)
    elif kind in ("bytes", "records"):
        w.nullable_bytes(v, compact)
    elif kind == "uuid":
        w.uuid(v)
    elif kind == "uint16":
        w.uint16(v)
    elif kind == "float64":
        w.float64(v)
    else:
        raise AssertionError(f"unknown field type {kind}")


def _write_slot(w: Writer, slot: _Slot, compact: bool, v: Any) -> None:
    if slot.array:
        if v is None:
            if not slot.nullable:
                raise ValueError(f"array {slot.name!r} is not nullable in this version")
            w.array_length(None, compact)
            return
        w.array_length(len(v), compact)
        if slot.sub is not None:
            for item in v:
                encode_struct(w, slot.sub, item)
        else:
            for item in v:
                _write_scalar(w, slot.kind, False, compact, item, slot.name)
        return
    if slot.sub is not None:
        if slot.nullable:
            if v is None:
                w.int8(-1)
                return
            w.int8(1)
        elif v is None:
            raise ValueError(f"struct {slot.name!r} is not nullable in this version")
        encode_struct(w, slot.sub, v)
        return
    _write_scalar(w, slot.kind, slot.nullable, compact, v, slot.name)


def encode_struct(w: Writer, plan: _Plan, msg: Message) -> None:
    """Encode ``msg``; a field it lacks takes its default."""
    compact = plan.flexible
    for slot in plan.regular:
        _write_slot(w, slot, compact, msg.get(slot.name, slot.default))
    if compact:
        tagged: dict[int, bytes] = {}
        for tag, slot in plan.tagged:
            v = msg.get(slot.name, slot.default)
            if v == slot.default:
                continue
            sub = Writer()
            _write_slot(sub, slot, compact, v)
            tagged[tag] = sub.getvalue()
        w.tagged_fields(tagged)
