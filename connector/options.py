"""Source options: parsed and checked once, when the DataFrame is defined (analysis time).

Names follow Spark's Kafka source where the meaning is the same. Every bad value raises
``QuorumLogOptionError`` naming the option, the value and what is accepted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..replica import defaults
from ..replica.client import parse_bootstrap
from ..replica.client.security import ClientSecurity
from .offsets import (
    EARLIEST,
    LATEST,
    OffsetsFormatError,
    Positions,
    TopicPartition,
    parse_offsets_json,
)

OffsetSpec = Literal["earliest", "latest"] | Positions
# A timestamp (ms) for every partition, or one per listed partition.
TimestampSpec = int | dict[TopicPartition, int]

DEFAULT_FETCH_MAX_BYTES = defaults.FETCH_MAX_BYTES
DEFAULT_REQUEST_TIMEOUT_MS = defaults.REQUEST_TIMEOUT_MS
DEFAULT_ATTEMPT_TIMEOUT_MS = defaults.ATTEMPT_TIMEOUT_MS
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000  # Spark's Kafka source: 15m
_DURATION_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}

# Security: TLS (CA, optional client cert and key) and SCRAM authentication; the source
# and the sink take them alike (``_security``).
SECURITY_OPTIONS = (
    "tlsCaFile",
    "tlsCertFile",
    "tlsKeyFile",
    "principal",
    "secretFile",
    "secretEnv",
    "secret",
)


def _by_lower_case(*names: str) -> dict[str, str]:
    """lower-case option key -> canonical name (Spark passes keys case-insensitively)."""
    return {name.lower(): name for name in names}


OPTION_NAMES = _by_lower_case(
    "bootstrap",
    "topic",
    "topicPattern",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "endingTimestamp",
    "endingOffsetsByTimestamp",
    "includeHeaders",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "minPartitions",
    "maxRecordsPerPartition",
    "onTruncation",
    "failOnDataLoss",
    "isolationLevel",
    "kafka.isolation.level",
    "fetchMaxBytes",
    "requestTimeoutMs",
    "attemptTimeoutMs",
    *SECURITY_OPTIONS,
)
# The options reference, generated into docs/reference/spark-options.md (tests/docs):
# canonical name -> (default, what it does). Every name in OPTION_NAMES has an entry.
OPTION_DOCS: dict[str, tuple[str, str]] = {
    "bootstrap": ("(required)", "`host:port[,host:port...]` of any nodes of the cluster"),
    "topic": ("one of `topic`, `topicPattern`", "a topic, or a comma-separated list of topics"),
    "topicPattern": ("one of `topic`, `topicPattern`", "a regular expression of topic names"),
    "startingOffsets": (
        "stream `latest`, batch `earliest`",
        "`earliest`, `latest` or offsets JSON with epochs",
    ),
    "endingOffsets": ("`latest`", "batch only: `latest` or offsets JSON"),
    "startingTimestamp": (
        "none",
        "ms since the epoch: every partition starts at its first record with timestamp >= it; "
        "wins over `startingOffsetsByTimestamp` and `startingOffsets`",
    ),
    "startingOffsetsByTimestamp": (
        "none",
        '`{"events": {"0": 1700000000000}}`: the same per listed partition (others: '
        "`startingOffsets`); wins over `startingOffsets`",
    ),
    "endingTimestamp": (
        "none",
        "batch only: end before the first record with timestamp >= it; a timestamp past "
        "every record resolves to `latest`",
    ),
    "endingOffsetsByTimestamp": ("none", "batch only: the same per listed partition"),
    "includeHeaders": (
        "`false`",
        "`true`: the `headers` column carries the records' headers; `false`: it is NULL "
        "(the column stays in the schema)",
    ),
    "maxOffsetsPerTrigger": ("none", "cap per micro-batch, split across partitions by data"),
    "minOffsetsPerTrigger": (
        "none",
        "a micro-batch waits until this many offsets are available, or `maxTriggerDelay` "
        "passed (not under `Trigger.AvailableNow`)",
    ),
    "maxTriggerDelay": (
        "`15m`",
        "the longest wait for `minOffsetsPerTrigger` (`500ms`, `30s`, `15m`, `1h`; a number is ms)",
    ),
    "minPartitions": (
        "none",
        "split large offset ranges so a batch has at least about this many Spark tasks",
    ),
    "maxRecordsPerPartition": ("none", "split ranges so no Spark task reads more offsets"),
    "onTruncation": (
        "`fail`",
        "`fail` raises `LogTruncationException`; `resume` re-reads from the divergence offset",
    ),
    "failOnDataLoss": (
        "`true`",
        "offsets below the log start (retention): fail, or skip to the log start with a warning",
    ),
    "isolationLevel": (
        "`read_committed`",
        "`read_committed`: records of committed transactions and non-transactional ones, "
        "planned to the last stable offset (aborted records and markers leave offset gaps, "
        "never truncation); `read_uncommitted`: everything up to the high watermark",
    ),
    "kafka.isolation.level": ("none", "Kafka's name for `isolationLevel`"),
    "fetchMaxBytes": ("8 MiB", "bytes per fetch request (a whole batch is always returned)"),
    "requestTimeoutMs": (
        "30000",
        "retries of a fetch, lookup or produce (NOT_LEADER, fenced epochs, restarts) stop "
        "after this",
    ),
    "attemptTimeoutMs": (
        "1500",
        "one attempt, connecting included: a node silent this long is given up on and the "
        "request retried on the current leader",
    ),
    "tlsCaFile": ("none", "CA file the nodes' certificates are verified against (turns TLS on)"),
    "tlsCertFile": ("none", "client certificate for mutual TLS (with `tlsKeyFile`)"),
    "tlsKeyFile": ("none", "the client certificate's private key"),
    "principal": ("none", "SCRAM principal; needs one of the three secret options"),
    "secretFile": ("none", "a file readable on the driver and every executor holding the secret"),
    "secretEnv": (
        "none",
        "an environment variable set on the driver and executors (`spark.executorEnv.NAME`)",
    ),
    "secret": (
        "none",
        "the secret itself: it travels in query plans, so only where they are private",
    ),
}
# Spark adds "path" when load(path) is used; it means nothing to this source.
_IGNORED = {"path"}
_KAFKA_HINTS = {
    "subscribe": "topic",
    "subscribepattern": "topicPattern",
    "kafka.bootstrap.servers": "bootstrap",
    "bootstrap.servers": "bootstrap",
    "bootstrapservers": "bootstrap",
    "topics": "topic",
}


class QuorumLogOptionError(ValueError):
    """A missing or bad option; raised when the DataFrame is defined."""


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    # None: the reader's default, as in Spark's Kafka source (stream: latest, batch: earliest)
    starting_offsets: OffsetSpec | None = None
    ending_offsets: OffsetSpec | None = None
    # startingTimestamp / startingOffsetsByTimestamp (and ending*): the first offset whose
    # record timestamp is >= the timestamp (ListOffsets); they take precedence over
    # startingOffsets / endingOffsets as in Spark's Kafka source.
    starting_timestamps: TimestampSpec | None = None
    ending_timestamps: TimestampSpec | None = None
    include_headers: bool = False
    max_offsets_per_trigger: int | None = None
    # A micro-batch waits until this many offsets are available, or maxTriggerDelay passed
    # since the last batch fired.
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    # Split large offset ranges into several Spark tasks (Spark Kafka source's options).
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    on_truncation: Literal["fail", "resume"] = "fail"
    fail_on_data_loss: bool = True
    # read_committed: plan to the last stable offset, drop aborted transactions' records.
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    attempt_timeout_ms: int = DEFAULT_ATTEMPT_TIMEOUT_MS
    security: ClientSecurity | None = None

    def timestamp_for(self, tp: TopicPartition, *, ending: bool) -> int | None:
        spec = self.ending_timestamps if ending else self.starting_timestamps
        if spec is None or isinstance(spec, int):
            return spec
        return spec.get(tp)

    def subscribes(self, topic: str) -> bool:
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics

    def describe_subscription(self) -> str:
        if self.topic_pattern is not None:
            return f"topicPattern={self.topic_pattern!r}"
        return "topic=" + ",".join(self.topics)


def _bad(option: str, value: str, accepted: str) -> QuorumLogOptionError:
    return QuorumLogOptionError(
        f"Invalid value for option '{option}': {value!r}. Accepted: {accepted}."
    )


def _positive_int(option: str, value: str, what: str) -> int:
    text = value.strip()
    if not re.fullmatch(r"[+]?\d+", text) or int(text) <= 0:
        raise _bad(option, value, f"a positive integer ({what})")
    return int(text)


def _bool(option: str, value: str) -> bool:
    text = value.strip().lower()
    if text not in ("true", "false"):
        raise _bad(option, value, "'true' or 'false'")
    return text == "true"


def _spec(option: str, value: str, *, ending: bool) -> OffsetSpec:
    text = value.strip()
    lowered = text.lower()
    if lowered == "latest":
        return "latest"
    if lowered == "earliest":
        if ending:
            raise _bad(
                option, value, "'latest' or a JSON object of offsets ('earliest' is not an end)"
            )
        return "earliest"
    if not text.startswith("{"):
        raise _bad(
            option,
            value,
            ("'latest'" if ending else "'earliest', 'latest'")
            + ' or a JSON object like {"events": {"0": {"offset": 1200, "epoch": 3}}}',
        )
    try:
        return parse_offsets_json(
            text, option=option, allow_sentinels=(LATEST,) if ending else (EARLIEST, LATEST)
        )
    except OffsetsFormatError as exc:
        raise QuorumLogOptionError(str(exc)) from None


def _duration_ms(option: str, value: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|min|h|d)?\s*", value.lower())
    if not match:
        raise _bad(
            option,
            value,
            "a duration like '15m', '30s', '500ms', '1h' or '2d' (a number alone: ms)",
        )
    return int(match.group(1)) * _DURATION_UNITS_MS[match.group(2) or "ms"]


def _timestamp(option: str, value: str) -> int:
    text = value.strip()
    if not re.fullmatch(r"[+]?\d+", text):
        raise _bad(option, value, "a timestamp in milliseconds since the epoch (an integer >= 0)")
    return int(text)


def _timestamps_json(option: str, value: str) -> dict[TopicPartition, int]:
    accepted = (
        'a JSON object of timestamps in ms per partition, like {"events": {"0": 1700000000000}}'
    )
    try:
        raw = json.loads(value)
    except json.JSONDecodeError:
        raise _bad(option, value, accepted) from None
    if not isinstance(raw, dict) or not raw:
        raise _bad(option, value, accepted)
    out: dict[TopicPartition, int] = {}
    for topic, parts in raw.items():
        if not isinstance(parts, dict) or not parts:
            raise _bad(option, value, accepted)
        for p, ts in parts.items():
            if not str(p).isdigit() or isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
                raise _bad(option, value, accepted)
            out[TopicPartition(str(topic), int(p))] = ts
    return out


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Check every option; the first problem raises ``QuorumLogOptionError``."""
    opts, bootstrap = _known_options_and_bootstrap(options, OPTION_NAMES, "format")

    has_topic = "topic" in opts
    has_pattern = "topicpattern" in opts
    if has_topic == has_pattern:
        raise QuorumLogOptionError(
            "Exactly one of the options 'topic' (a name or comma-separated names) and "
            "'topicPattern' (a regular expression matched against whole topic names) is "
            + ("required." if not has_topic else "accepted, both were given.")
        )
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    if has_topic:
        names = [t.strip() for t in opts["topic"].split(",")]
        if not names or any(not t or re.search(r"\s", t) for t in names):
            raise _bad("topic", opts["topic"], "a topic name or comma-separated names, none empty")
        topics = tuple(dict.fromkeys(names))
    else:
        pattern = opts["topicpattern"]
        if not pattern.strip():
            raise _bad("topicPattern", pattern, "a non-empty regular expression")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise _bad(
                "topicPattern", pattern, f"a valid Python regular expression ({exc})"
            ) from None

    starting = (
        _spec("startingOffsets", opts["startingoffsets"], ending=False)
        if "startingoffsets" in opts
        else None
    )
    ending = (
        _spec("endingOffsets", opts["endingoffsets"], ending=True)
        if "endingoffsets" in opts
        else None
    )
    for option, spec in (("startingOffsets", starting), ("endingOffsets", ending)):
        if isinstance(spec, dict):
            foreign = sorted(
                {
                    tp.topic
                    for tp in spec
                    if (
                        tp.topic not in topics
                        if pattern is None
                        else not re.fullmatch(pattern, tp.topic)
                    )
                }
            )
            if foreign:
                raise QuorumLogOptionError(
                    f"Invalid value for option '{option}': topics {foreign} are not subscribed "
                    f"({'topic=' + ','.join(topics) if pattern is None else 'topicPattern=' + repr(pattern)}). "
                    "Accepted: offsets only for subscribed topics."
                )

    timestamps: list[TimestampSpec | None] = []
    for single, per_partition in (
        ("startingTimestamp", "startingOffsetsByTimestamp"),
        ("endingTimestamp", "endingOffsetsByTimestamp"),
    ):
        spec: TimestampSpec | None = None
        if single.lower() in opts:  # takes precedence, as in Spark
            spec = _timestamp(single, opts[single.lower()])
        elif per_partition.lower() in opts:
            spec = _timestamps_json(per_partition, opts[per_partition.lower()])
            foreign = sorted(
                {tp.topic for tp in spec if not _subscribed(tp.topic, topics, pattern)}
            )
            if foreign:
                raise _bad(
                    per_partition,
                    opts[per_partition.lower()],
                    f"timestamps only for subscribed topics (not {foreign})",
                )
        timestamps.append(spec)

    max_offsets = None
    if "maxoffsetspertrigger" in opts:
        max_offsets = _positive_int(
            "maxOffsetsPerTrigger",
            opts["maxoffsetspertrigger"],
            "the most offsets one micro-batch reads, split across partitions",
        )

    min_offsets = None
    if "minoffsetspertrigger" in opts:
        min_offsets = _positive_int(
            "minOffsetsPerTrigger",
            opts["minoffsetspertrigger"],
            "the least offsets a micro-batch waits for, up to maxTriggerDelay",
        )
    if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
        raise _bad(
            "minOffsetsPerTrigger",
            opts["minoffsetspertrigger"],
            f"at most maxOffsetsPerTrigger ({max_offsets})",
        )
    max_delay = DEFAULT_MAX_TRIGGER_DELAY_MS
    if "maxtriggerdelay" in opts:
        max_delay = _duration_ms("maxTriggerDelay", opts["maxtriggerdelay"])

    min_partitions = None
    if "minpartitions" in opts:
        min_partitions = _positive_int(
            "minPartitions",
            opts["minpartitions"],
            "the least number of Spark tasks a batch is split into; large offset ranges "
            "are divided",
        )
    max_records = None
    if "maxrecordsperpartition" in opts:
        max_records = _positive_int(
            "maxRecordsPerPartition",
            opts["maxrecordsperpartition"],
            "the most offsets one Spark task reads; larger ranges are divided",
        )

    on_truncation = opts.get("ontruncation", "fail").strip().lower()
    if on_truncation not in ("fail", "resume"):
        raise _bad(
            "onTruncation",
            opts["ontruncation"],
            "'fail' (raise LogTruncationException) or 'resume' (re-read from the divergence "
            "offset, logging a warning)",
        )

    isolation = _isolation(opts)

    return SourceOptions(
        isolation_level=isolation,
        security=_security(opts),
        bootstrap=bootstrap,
        topics=topics,
        topic_pattern=pattern,
        starting_offsets=starting,
        ending_offsets=ending,
        starting_timestamps=timestamps[0],
        ending_timestamps=timestamps[1],
        include_headers=_bool("includeHeaders", opts.get("includeheaders", "false")),
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=max_delay,
        min_partitions=min_partitions,
        max_records_per_partition=max_records,
        on_truncation="fail" if on_truncation == "fail" else "resume",
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss", "true")),
        fetch_max_bytes=_positive_int(
            "fetchMaxBytes",
            opts.get("fetchmaxbytes", str(DEFAULT_FETCH_MAX_BYTES)),
            "bytes one Fetch request may return",
        ),
        request_timeout_ms=_positive_int(
            "requestTimeoutMs",
            opts.get("requesttimeoutms", str(DEFAULT_REQUEST_TIMEOUT_MS)),
            "milliseconds a request, with its retries, may take",
        ),
        attempt_timeout_ms=_positive_int(
            "attemptTimeoutMs",
            opts.get("attempttimeoutms", str(DEFAULT_ATTEMPT_TIMEOUT_MS)),
            "milliseconds one attempt of a request may take before its node is given up on "
            "and the request retried on the current leader",
        ),
    )


SINK_OPTION_NAMES = _by_lower_case(
    "bootstrap",
    "topic",
    "requestTimeoutMs",
    "delivery",
    "transactionTimeoutMs",
    *SECURITY_OPTIONS,
)
#: The sink's own options, for the reference page: (default, meaning).
SINK_OPTION_DOCS = {
    "delivery": (
        "`exactly-once`",
        "`exactly-once`: each batch's rows appear to read_committed readers once, together, "
        "whatever fails (a transaction group per query, fenced by the batch id); "
        "`at-least-once`: a retried task or batch writes its rows again",
    ),
    "transactionTimeoutMs": (
        "60000",
        "exactly once: how long a task's transaction may wait for its batch's commit before "
        "its coordinator aborts it",
    ),
}
#: The sink's ``delivery`` values; the first is the default.
SINK_DELIVERIES = ("exactly-once", "at-least-once")
#: How long a sink task's transaction may wait for its batch's commit (its coordinator
#: aborts it after): the longest micro-batch, as Kafka's producer default.
DEFAULT_SINK_TRANSACTION_TIMEOUT_MS = 60_000


@dataclass(frozen=True)
class SinkDelivery:
    """``delivery`` and ``transactionTimeoutMs`` of the sink."""

    exactly_once: bool
    transaction_timeout_ms: int


def parse_sink_delivery(options: Mapping[str, str]) -> SinkDelivery:
    """``delivery``: ``exactly-once`` (the default: each batch's rows appear to
    read_committed readers once, together) or ``at-least-once``; ``transactionTimeoutMs``:
    how long a task's transaction waits for its batch's commit before its coordinator
    aborts it (default 60000)."""
    opts = {k.lower(): v for k, v in options.items()}
    delivery = opts.get("delivery", SINK_DELIVERIES[0]).strip().lower()
    if delivery not in SINK_DELIVERIES:
        raise _bad("delivery", opts["delivery"], " or ".join(SINK_DELIVERIES))
    return SinkDelivery(
        delivery == "exactly-once",
        _positive_int(
            "transactionTimeoutMs",
            opts.get("transactiontimeoutms", str(DEFAULT_SINK_TRANSACTION_TIMEOUT_MS)),
            "milliseconds a task's transaction may wait for its batch's commit",
        ),
    )


def parse_sink_options(options: Mapping[str, str]) -> SourceOptions:
    """The sink's options (``df.write.format("quorumlog")``): bootstrap, an optional single
    ``topic`` (else a 'topic' column), requestTimeoutMs and the security options."""
    # Spark hands a streaming sink the query's checkpointLocation (and queryName) too.
    opts, bootstrap = _known_options_and_bootstrap(
        options,
        SINK_OPTION_NAMES,
        "writing format",
        also_ignored=("checkpointlocation", "queryname"),
    )
    topics: tuple[str, ...] = ()
    if "topic" in opts:
        topic = opts["topic"].strip()
        if not topic or re.search(r"[\s,]", topic):
            raise _bad(
                "topic", opts["topic"], "one topic name (rows may name theirs in a 'topic' column)"
            )
        topics = (topic,)
    return SourceOptions(
        bootstrap=bootstrap,
        topics=topics,
        request_timeout_ms=_positive_int(
            "requestTimeoutMs",
            opts.get("requesttimeoutms", str(DEFAULT_REQUEST_TIMEOUT_MS)),
            "milliseconds a request, with its retries, may take",
        ),
        security=_security(opts),
    )


def _subscribed(topic: str, topics: tuple[str, ...], pattern: str | None) -> bool:
    return topic in topics if pattern is None else re.fullmatch(pattern, topic) is not None


def _security(opts: Mapping[str, str]) -> ClientSecurity | None:
    """TLS and credentials. The secret is named by 'secretFile' (a path readable on the
    driver and every executor) or 'secretEnv' (a variable set there, e.g. with
    spark.executorEnv.*), so query plans carry where it lives, not the secret. A plain
    'secret' option works too but travels in the plan and the task descriptions."""
    ca, cert, key = opts.get("tlscafile"), opts.get("tlscertfile"), opts.get("tlskeyfile")
    principal = opts.get("principal")
    sources = [k for k in ("secretfile", "secretenv", "secret") if opts.get(k)]
    if not (ca or cert or key or principal or sources):
        return None
    if (cert is None) != (key is None):
        raise QuorumLogOptionError(
            "Options 'tlsCertFile' and 'tlsKeyFile' go together (a client certificate "
            "for mutual TLS needs its key)."
        )
    if cert is not None and ca is None:
        raise QuorumLogOptionError(
            "Option 'tlsCertFile' needs 'tlsCaFile' (the CA the nodes' certificates are "
            "verified against)."
        )
    if principal is not None and len(sources) != 1:
        raise QuorumLogOptionError(
            f"Option 'principal' ({principal!r}) needs exactly one of 'secretFile', "
            "'secretEnv' or 'secret' (got "
            + (", ".join(OPTION_NAMES[k] for k in sources) or "none")
            + ")."
        )
    if principal is None and sources:
        raise QuorumLogOptionError(
            "Options 'secretFile', 'secretEnv' and 'secret' need option 'principal'."
        )
    return ClientSecurity(
        ca_file=ca,
        cert_file=cert,
        key_file=key,
        principal=principal,
        secret_file=opts.get("secretfile"),
        secret_env=opts.get("secretenv"),
        secret=opts.get("secret"),
    )


def _isolation(opts: Mapping[str, str]) -> Literal["read_committed", "read_uncommitted"]:
    """Option isolationLevel, or Kafka's name for it (kafka.isolation.level)."""
    given = {
        name: opts[key].strip().lower()
        for name, key in (
            ("isolationLevel", "isolationlevel"),
            ("kafka.isolation.level", "kafka.isolation.level"),
        )
        if key in opts
    }
    if len(set(given.values())) > 1:
        raise QuorumLogOptionError(
            "Options 'isolationLevel' and 'kafka.isolation.level' disagree "
            f"({given['isolationLevel']!r} vs {given['kafka.isolation.level']!r}): give one."
        )
    for name, value in given.items():
        if value == "read_uncommitted":
            return "read_uncommitted"
        if value != "read_committed":
            raise _bad(
                name,
                opts["isolationlevel" if name == "isolationLevel" else name],
                "'read_committed' (only committed transactions' records) or "
                "'read_uncommitted' (every record up to the high watermark)",
            )
    return "read_committed"


def _known_options_and_bootstrap(
    options: Mapping[str, str],
    accepted: dict[str, str],
    what: str,
    also_ignored: tuple[str, ...] = (),
) -> tuple[dict[str, str], str]:
    """Lower-cased options, every one known (else an error naming our equivalent of a
    Kafka option), and the validated ``bootstrap``; shared by the source and the sink."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    for key in opts:
        if key in accepted or key in _IGNORED or key in also_ignored:
            continue
        hint = _KAFKA_HINTS.get(key)
        raise QuorumLogOptionError(
            f"Unknown option '{key}' for {what} 'quorumlog'"
            + (f" (did you mean '{hint}'?)" if hint else "")
            + ". Accepted options: "
            + ", ".join(sorted(accepted.values()))
            + "."
        )
    if "bootstrap" not in opts or not opts["bootstrap"].strip():
        raise QuorumLogOptionError(
            "Missing required option 'bootstrap': give the cluster's addresses as "
            "host:port[,host:port...], e.g. .option('bootstrap', '127.0.0.1:9092')."
        )
    bootstrap = opts["bootstrap"].strip()
    try:
        parse_bootstrap(bootstrap)
    except ValueError as exc:
        raise _bad("bootstrap", opts["bootstrap"], f"host:port[,host:port...] ({exc})") from None
    return opts, bootstrap
