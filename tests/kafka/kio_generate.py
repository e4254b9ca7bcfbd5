"""Generates ``replica/kafka/kio_messages.py``: message schemas taken from ``kio``
instead of transcribed by hand. Run ``python -m tests.kafka.kio_generate`` after
changing ``GENERATED`` or kio's version; ``test_kio_generated`` fails while the file
differs from what this writes.

``kio`` (PyPI) holds a frozen dataclass per Kafka request and response version,
generated from apache/kafka's own message definitions
(``clients/src/main/resources/common/message/*.json``): each field's Kafka type, tag,
nullability (``X | None``) and default are in its annotation and metadata.
:func:`kio_api` reads those classes for every version we serve and merges them into
one :class:`~.schema.Api` (fields with the version ranges they have), which the
listener's codec (``schema``) encodes and decodes like any other; handlers keep working
on plain dicts with Kafka's snake_case field names.

The schemas are generated into a module, not derived when a node starts: deriving the
APIs below from kio's classes takes about 0.5 s on a quiet 2-core machine (each version
is a module of frozen dataclasses), which every node and CLI start would pay; and the
wire format a node speaks stays what the checked-in file says, whatever kio release an
install holds.

kio names a duration or a timestamp by what it holds (``throttle_time``, a
``timedelta``); Kafka's definitions, and so our messages, by its unit
(``throttle_time_ms``): such fields get their ``_ms`` back. Values become plain Python
(ints, lists): what the codec and the handlers use.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import importlib
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from quorumlog.replica.kafka.schema import Api, F

__all__ = ["GENERATED", "kio_api", "kio_class", "render"]

#: What ``kio_messages`` holds: (constant, Kafka's API name, versions served): every API
#: off the produce/fetch path of which kio has every version we serve (Kafka 4's
#: definitions dropped OffsetCommit, OffsetFetch, CreateTopics, DeleteTopics and
#: DescribeConfigs version 0, which clients still negotiate: those stay in ``messages``).
GENERATED: tuple[tuple[str, str, int, int], ...] = (
    ("FIND_COORDINATOR", "FindCoordinator", 0, 6),
    ("JOIN_GROUP", "JoinGroup", 0, 9),
    ("HEARTBEAT", "Heartbeat", 0, 4),
    ("LEAVE_GROUP", "LeaveGroup", 0, 5),
    ("SYNC_GROUP", "SyncGroup", 0, 5),
    ("SASL_HANDSHAKE", "SaslHandshake", 0, 1),
    ("API_VERSIONS", "ApiVersions", 0, 4),
    ("INIT_PRODUCER_ID", "InitProducerId", 0, 5),
    ("OFFSET_FOR_LEADER_EPOCH", "OffsetForLeaderEpoch", 2, 4),
    ("SASL_AUTHENTICATE", "SaslAuthenticate", 0, 2),
    ("DESCRIBE_GROUPS", "DescribeGroups", 0, 5),
    ("LIST_GROUPS", "ListGroups", 0, 5),
    ("DELETE_GROUPS", "DeleteGroups", 0, 2),
    ("OFFSET_DELETE", "OffsetDelete", 0, 0),
    ("DESCRIBE_CLUSTER", "DescribeCluster", 0, 1),
    ("CREATE_PARTITIONS", "CreatePartitions", 0, 3),
    ("ALTER_CONFIGS", "AlterConfigs", 0, 2),
    ("INCREMENTAL_ALTER_CONFIGS", "IncrementalAlterConfigs", 0, 1),
    # Transactions (KIP-98, KIP-447), at the clients' versions: AddPartitionsToTxn v4+ is
    # KIP-890's broker-side form; WriteTxnMarkers is between brokers (kio has no v0).
    ("ADD_PARTITIONS_TO_TXN", "AddPartitionsToTxn", 0, 3),
    ("ADD_OFFSETS_TO_TXN", "AddOffsetsToTxn", 0, 3),
    ("END_TXN", "EndTxn", 0, 3),
    ("TXN_OFFSET_COMMIT", "TxnOffsetCommit", 0, 3),
    ("WRITE_TXN_MARKERS", "WriteTxnMarkers", 1, 1),
    ("DESCRIBE_TRANSACTIONS", "DescribeTransactions", 0, 0),
    ("LIST_TRANSACTIONS", "ListTransactions", 0, 1),
)
TARGET = Path(__file__).resolve().parents[2] / "replica" / "kafka" / "kio_messages.py"

#: kio's Kafka types that are ours under another name.
_WIRE_TYPE = {
    "error_code": "int16",
    "timedelta_i32": "int32",
    "timedelta_i64": "int64",
    "datetime_i64": "int64",
}
#: kio's types whose field name lost Kafka's unit suffix.
_IN_MS = ("timedelta_i32", "timedelta_i64", "datetime_i64")
#: The Kafka types a null can be sent for.
_NULLABLE = ("string", "bytes", "records")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def kio_api(name: str, min_version: int, max_version: int) -> Api:
    """The Api ``name`` (Kafka's name: "ListGroups") serving ``min_version`` ..
    ``max_version``, every version's request and response as kio defines them."""
    versions = range(min_version, max_version + 1)
    requests = {v: kio_class(name, v, "request") for v in versions}
    responses = {v: kio_class(name, v, "response") for v in versions}
    flexible = [v for v in versions if requests[v].__flexible__]
    if flexible and flexible[-1] != max_version:
        raise ValueError(f"{name}: flexible versions {flexible} do not run to the newest")
    return Api(
        int(requests[min_version].__api_key__),
        name,
        min_version,
        max_version,
        flexible=_range(flexible),
        request=_merged(requests),
        response=_merged(responses),
    )


def kio_class(api_name: str, version: int, kind: str) -> Any:
    """kio's class of ``api_name``'s ``kind`` ("request", "response") at ``version``;
    ValueError if kio has none (Kafka 4 dropped the oldest versions of several APIs)."""
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", api_name).lower()
    try:
        module = importlib.import_module(f"kio.schema.{snake}.v{version}.{kind}")
    except ModuleNotFoundError:
        raise ValueError(f"kio has no {api_name} {kind} version {version}") from None
    return getattr(module, f"{api_name}{kind.capitalize()}")


class _Field(typing.NamedTuple):
    """One kio field at one version, in our terms."""

    name: str
    type: str  # ours: "int32", "[]string", "[]" (structs), "{}" (one struct)
    nullable: bool
    tag: int | None
    default: Any  # ``...``: none given
    sub: Any  # the nested struct's class, or None


def _merged(classes: dict[int, Any]) -> tuple[F, ...]:
    """One field list for the versions ``classes`` has (version -> class): each field
    with the version ranges in which it exists, is nullable and is tagged, in Kafka's
    order (a field new in a version goes before the field that follows it there)."""
    per_version = {v: _fields(cls) for v, cls in classes.items()}
    order: list[str] = []
    for fields in per_version.values():
        following = len(order)  # where the field after this one (in this version) is
        for f in reversed(fields):
            if f.name not in order:
                order.insert(following, f.name)
            following = order.index(f.name)
    out = []
    for name in order:
        seen = {v: f for v, fields in per_version.items() for f in fields if f.name == name}
        first = next(iter(seen.values()))
        if any(f.type != first.type for f in seen.values()):
            raise ValueError(f"field {name!r} changes type across versions")
        defaults = [f.default for f in seen.values() if f.default is not ...]
        sub = {v: f.sub for v, f in seen.items()} if first.sub is not None else None
        out.append(
            F(
                name,
                first.type,
                _range(seen),
                nullable=_range([v for v, f in seen.items() if f.nullable]),
                tag=first.tag,
                tagged=_range([v for v, f in seen.items() if f.tag is not None]),
                default=defaults[0] if defaults else ...,
                fields=_merged(sub) if sub is not None else (),
            )
        )
    return tuple(out)


def _range(versions: typing.Iterable[int]) -> str:
    """Kafka's version-range string of a contiguous set of versions ("none" if empty)."""
    vs = sorted(versions)
    if not vs:
        return "none"
    if vs != list(range(vs[0], vs[-1] + 1)):
        raise ValueError(f"versions {vs} are not a range")
    return f"{vs[0]}-{vs[-1]}"


@functools.cache
def _fields(cls: Any) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(_field(f, hints[f.name]) for f in dataclasses.fields(cls))


def _field(f: dataclasses.Field[Any], hint: Any) -> _Field:
    hint, nullable = _unwrap_optional(hint)
    kafka_type = f.metadata.get("kafka_type")
    default = _plain(f.default) if f.default is not dataclasses.MISSING else ...
    tag = f.metadata.get("tag")
    if typing.get_origin(hint) is tuple:
        element, _ = _unwrap_optional(typing.get_args(hint)[0])
        if dataclasses.is_dataclass(element):
            return _Field(f.name, "[]", nullable, tag, default, element)
        return _Field(f.name, "[]" + _wire(kafka_type), nullable, tag, default, None)
    if dataclasses.is_dataclass(hint):
        return _Field(f.name, "{}", nullable, tag, default, hint)
    name = f.name + "_ms" if kafka_type in _IN_MS else f.name
    if kafka_type not in _NULLABLE and (nullable or default is None):
        # kio reads a sentinel of a number or a uuid (-1, the zero uuid) as None: a value
        # it maps, not a null on the wire, whose sentinel it does not name.
        raise ValueError(f"{name}: kio maps a {kafka_type} sentinel to None")
    return _Field(name, _wire(kafka_type), nullable, tag, default, None)


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return inner, True
    return hint, False


def _wire(kafka_type: Any) -> str:
    if not isinstance(kafka_type, str):
        raise ValueError(f"a kio field without a Kafka type: {kafka_type!r}")
    return _WIRE_TYPE.get(kafka_type, kafka_type)


def _plain(value: Any) -> Any:
    """A kio default as the codec's plain value."""
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    if isinstance(value, datetime.datetime):
        return (value - _EPOCH) // datetime.timedelta(milliseconds=1)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


# --- the module's text ------------------------------------------------------------------


def render() -> str:
    """The text of ``kio_messages.py``."""
    from kio import _version  # noqa: PLC0415 (kio's version, for the header)

    lines = [
        '"""Kafka message schemas generated by ``python -m tests.kafka.kio_generate`` from',
        f"kio {_version.__version__} (its classes are generated from apache/kafka's message",
        'definitions). Do not edit: change the generator and run it."""',
        "",
        "from __future__ import annotations",
        "",
        "from .schema import Api, F",
        "",
        "# fmt: off",
    ]
    for const, name, low, high in GENERATED:
        api = kio_api(name, low, high)
        lines.append(
            f'{const} = Api({api.key}, "{name}", {low}, {high}, '
            f'flexible="{_open(api.flexible, high)}",'
        )
        for part in ("request", "response"):
            lines.append(f"    {part}=(")
            lines += _render_fields(getattr(api, part), high, "        ")
            lines.append("    ),")
        lines.append(")")
    lines += ["# fmt: on", "", "__all__ = ["]
    lines += [f'    "{const}",' for const, *_ in GENERATED]
    lines += ["]", ""]
    return "\n".join(lines)


def _render_fields(fields: tuple[F, ...], newest: int, indent: str) -> list[str]:
    out = []
    for f in fields:
        args = [f'"{f.name}"', f'"{f.type}"', f'"{_open(f.versions, newest)}"']
        if f.nullable != "none":
            args.append(f'nullable="{_open(f.nullable, newest)}"')
        if f.tag is not None:
            args += [f"tag={f.tag}", f'tagged="{_open(f.tagged, newest)}"']
        if f.default is not ...:
            args.append(f"default={f.default!r}")
        if not f.fields:
            out.append(f"{indent}F({', '.join(args)}),")
            continue
        out.append(f"{indent}F({', '.join(args)}, fields=(")
        out += _render_fields(f.fields, newest, indent + "    ")
        out.append(f"{indent})),")
    return out


def _open(versions: str, newest: int) -> str:
    """ "3-9" as Kafka writes it ("3+") when 9 is the newest version served."""
    low, _, high = versions.partition("-")
    return f"{low}+" if high and int(high) == newest else versions


if __name__ == "__main__":
    TARGET.write_text(render())
    sys.stdout.write(f"wrote {TARGET}\n")
