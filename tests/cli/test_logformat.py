"""``serve --log-format json``: one JSON object a line naming the node, and the topic and
partition of a line about one; text lines name the node too."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest
from quorumlog.replica.cli.logformat import (
    NODE_TEXT_FORMAT,
    JsonFormatter,
    NodeField,
    PartitionField,
)
from quorumlog.replica.client import Client
from quorumlog.replica.logcontext import about
from quorumlog.replica.node.cluster import free_ports

from tests.support.cli import QUORUMLOG
from tests.support.waits import wait_until


def _record(message: str, *args: object) -> logging.LogRecord:
    record = logging.LogRecord("quorumlog.x", logging.INFO, "f.py", 1, message, args, None)
    NodeField(2).filter(record)
    PartitionField().filter(record)
    return record


def _line(message: str, *args: object) -> dict[str, object]:
    out: dict[str, object] = json.loads(JsonFormatter().format(_record(message, *args)))
    return out


def _text(message: str, *args: object) -> str:
    return logging.Formatter(NODE_TEXT_FORMAT).format(_record(message, *args))


def test_json_line_names_node_topic_and_partition() -> None:
    line = _line("%s: leader in epoch %d", "orders/3", 4)
    assert line["node"] == 2 and line["level"] == "INFO" and line["logger"] == "quorumlog.x"
    assert (line["topic"], line["partition"]) == ("orders", 3)
    assert line["message"] == "orders/3: leader in epoch 4"
    assert str(line["time"]).endswith("Z")
    assert _line("deleted replica %s/%d", "t", 0)["partition"] == 0
    assert "topic" not in _line("see /data/7/node-1.log")


def test_a_line_made_while_the_driver_steps_a_partition_names_it() -> None:
    """The raft core's lines name no partition ("replica 2 leads epoch 5"): the driver
    steps each partition ``with about(key)``, and every line gets its topic/partition."""
    with about(("orders", 3)):
        line = _line("replica %s leads epoch %s", 2, 5)
        text = _text("replica %s leads epoch %s", 2, 5)
        named = _text("%s: leader in epoch %d", "orders/3", 4)
    assert (line["topic"], line["partition"], line["node"]) == ("orders", 3, 2)
    assert " node-2 orders/3 quorumlog.x: replica 2 leads epoch 5" in text
    assert named.count("orders/3") == 1  # the message names it: not twice
    assert "orders/3" not in _text("replica %s leads epoch %s", 2, 5)  # outside any step
    assert "topic" not in _line("node %d silent for %d ms", 3, 1500)
    with about(("orders", 3)):  # a message its arguments do not fit: the filter lets it by
        assert PartitionField().filter(_record("replica %d", "x"))


@pytest.mark.cluster
def test_a_serving_node_writes_json_lines(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    proc = subprocess.Popen(
        [*QUORUMLOG, "serve", "--node-id", "1", "--listen", f"127.0.0.1:{port}"]
        + ["--voters", f"1@127.0.0.1:{port}", "--data-dir", str(tmp_path / "d")]
        + ["--cluster-id", "c", "--log-format", "json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with Client(f"127.0.0.1:{port}", request_timeout_ms=2000) as c:
            wait_until(lambda: c.api_versions(), 30, "the node to answer", interval=0.1)
            c.create_topic("logged", 1, 1)
            wait_until(
                lambda: c.metadata(["logged"])["logged"].partitions[0].leader_id == 1,
                30,
                "logged/0 led",
            )
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    lines = [json.loads(text) for text in err.splitlines()]
    assert lines and all(line["node"] == 1 for line in lines)
    about_it = [line for line in lines if line.get("topic") == "logged"]
    assert about_it and all(line["partition"] == 0 for line in about_it), lines
    # The raft core's own lines ("replica 1 starts ...", "replica 1 leads epoch ...")
    # name no partition in their message, yet carry it.
    raft = [line for line in about_it if str(line["logger"]).startswith("quorumlog.replica.raft")]
    assert any("leads epoch" in str(line["message"]) for line in raft), lines
