"""How the ``quorumlog`` command writes its log: text lines or one JSON object a line
(``serve --log-format json``), each naming the node id when it serves one, and, for a
line about a partition, ``topic/partition`` (in JSON the topic and partition as fields of
their own). A line is about a partition when the driver was stepping that partition as
it was made (``replica.logcontext``: the raft core's lines), or when its message names
one as ``topic/partition`` (the driver's and the node's lines)."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

from ..logcontext import PARTITION as STEPPING

FORMATS = ("text", "json")
# ``about`` is " topic/partition" for a line made while the driver stepped a partition
# whose message does not name it already, else empty (PartitionField).
TEXT_FORMAT = "%(asctime)s %(levelname)s%(about)s %(name)s: %(message)s"
# The node id leads a serving node's text lines: "node-2 quorumlog.replica....".
NODE_TEXT_FORMAT = "%(asctime)s %(levelname)s node-%(node)s%(about)s %(name)s: %(message)s"
#: The first ``topic/partition`` of a message, at its start or after a space (a path,
#: ``/data/7``, is not one); topic names have no ``/``, ``:`` or spaces.
PARTITION = re.compile(r"(?:^|\s)([^\s/:]+)/(\d+)\b")


class NodeField(logging.Filter):
    """Stamps every record with the node id (``record.node``)."""

    def __init__(self, node_id: int) -> None:
        super().__init__()
        self.node_id = node_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.node = self.node_id
        return True


class PartitionField(logging.Filter):
    """Stamps every record with the partition the driver was stepping as it was made
    (``record.partition_key``: (topic, partition) or None) and, for text lines,
    ``record.about``: " topic/partition" unless the message names it already."""

    def filter(self, record: logging.LogRecord) -> bool:
        key = STEPPING.get()
        record.partition_key = key
        record.about = ""
        if key is not None:
            name = f"{key[0]}/{key[1]}"
            try:
                named = name in record.getMessage()
            except Exception:  # the formatter reports a bad message; a filter must not raise
                named = False
            if not named:
                record.about = " " + name
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, node (when
    serving), topic and partition (a line about a partition), message, exception."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
        }
        node = getattr(record, "node", None)
        if node is not None:
            out["node"] = node
        key = getattr(record, "partition_key", None)
        found = PARTITION.search(message) if key is None else None
        if key is not None:
            out["topic"], out["partition"] = key
        elif found:
            out["topic"], out["partition"] = found.group(1), int(found.group(2))
        out["message"] = message
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup_logging(level: str, log_format: str = "text", node_id: int | None = None) -> None:
    """The root logger writes to stderr in ``log_format``, at ``level``."""
    if log_format not in FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(PartitionField())
    if node_id is not None:
        handler.addFilter(NodeField(node_id))
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(TEXT_FORMAT if node_id is None else NODE_TEXT_FORMAT)
        )
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
