"""kcat (Debian's kafkacat), the shell's Kafka client, against the nodes' Kafka listener:
the one-liners the README gives produce keyed lines, consume them back exactly, and list
the cluster, in plaintext and over SASL_SSL. The set-up (``make venv`` / ``make test``)
installs kcat, so a missing kcat fails here rather than skipping."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.cluster import read_all

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

#: partition -> (key, value) lines, as ``kcat -P -K :`` reads them.
LINES = {
    0: [(f"key-{i}", f"value {i} on zero") for i in range(20)],
    1: [(f"key-{i}", f"value {i} on one") for i in range(7)],
}


def kcat() -> str:
    path = shutil.which("kcat") or shutil.which("kafkacat")
    assert path, "kcat is not installed: `make venv` installs Debian's kafkacat package"
    return path


def run(*args: str, stdin: str = "") -> str:
    done = subprocess.run(
        [kcat(), *args], input=stdin.encode(), capture_output=True, timeout=60, check=False
    )
    shown = " ".join("sasl.password=***" if a.startswith("sasl.password=") else a for a in args)
    assert done.returncode == 0, f"kcat {shown}: {done.stderr.decode()[-2000:]}"
    return done.stdout.decode()


def produce_and_consume(
    c: LocalCluster, topic: str, produce: list[str], consume: list[str]
) -> None:
    """kcat -P the LINES into ``topic``; kcat -C -e them back; the same keys, values and
    offsets as a native read of the partitions."""
    for partition, lines in LINES.items():
        text = "".join(f"{k}:{v}\n" for k, v in lines)
        run(*produce, "-t", topic, "-P", "-K", ":", "-p", str(partition), stdin=text)
    out = run(*consume, "-t", topic, "-C", "-e", "-o", "beginning", "-f", "%p\t%o\t%k\t%s\n")
    got: dict[int, list[tuple[int, str, str]]] = {p: [] for p in LINES}
    for line in out.splitlines():
        partition, offset, key, value = line.split("\t")
        got[int(partition)].append((int(offset), key, value))
    for partition, lines in LINES.items():
        native = read_all(c.client, topic, partition)
        assert [(o, k, v) for o, k, v in got[partition]] == [
            (offset, key, value.decode())
            for (offset, _, value), (key, _) in zip(native, lines, strict=True)
        ]
        assert [(k, v) for _, k, v in got[partition]] == lines


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(3, tmp_path_factory.mktemp("kcat"), kafka=True) as c:
        yield c


def test_kcat_produces_and_consumes_keyed_lines(plain: LocalCluster) -> None:
    plain.create_topic("kcat-lines", 2)
    broker = ["-b", plain.kafka_bootstrap]
    produce_and_consume(plain, "kcat-lines", broker, broker)


def test_kcat_lists_the_cluster(plain: LocalCluster) -> None:
    plain.create_topic("kcat-listed", 3)
    doc = json.loads(run("-b", plain.kafka_bootstrap, "-L", "-J"))
    assert sorted(b["id"] for b in doc["brokers"]) == [1, 2, 3]
    topic = next(t for t in doc["topics"] if t["topic"] == "kcat-listed")
    assert [p["partition"] for p in topic["partitions"]] == [0, 1, 2]
    assert all(len(p["replicas"]) == 3 and p["leader"] in (1, 2, 3) for p in topic["partitions"])
    text = run("-b", plain.kafka_bootstrap, "-L", "-t", "kcat-listed")
    assert "3 brokers:" in text and 'topic "kcat-listed" with 3 partitions' in text


def test_kcat_over_sasl_ssl(tmp_path_factory: pytest.TempPathFactory) -> None:
    principals = {"ingest": ("producer", ["kcat-*"]), "reader": ("consumer", ["kcat-*"])}
    with LocalCluster(
        3, tmp_path_factory.mktemp("kcat-sasl"), secure=True, principals=principals, kafka=True
    ) as c:
        c.create_topic("kcat-secure", 2)
        assert c.ca_file is not None

        def login(principal: str, mechanism: str) -> list[str]:
            return [
                "-b", c.kafka_bootstrap,
                "-X", "security.protocol=SASL_SSL",
                "-X", f"ssl.ca.location={c.ca_file}",
                "-X", f"sasl.mechanisms={mechanism}",
                "-X", f"sasl.username={principal}",
                "-X", f"sasl.password={c.secrets[principal]}",
            ]  # fmt: skip

        produce_and_consume(
            c,
            "kcat-secure",
            login("ingest", "SCRAM-SHA-512"),
            login("reader", "SCRAM-SHA-256"),
        )
        listed = json.loads(run(*login("reader", "SCRAM-SHA-512"), "-L", "-J"))
        assert [t["topic"] for t in listed["topics"]] == ["kcat-secure"]
