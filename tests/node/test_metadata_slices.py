"""Metadata of thousands of partitions is built a slice at a time, one answer at a time:
a node answering many clients' refreshes at once (as when leadership moves) still
answers everything else, its heartbeats among them, within a slice or so. Built whole,
each answer held the event loop for as long as it took, and a dozen of them stalled
the node long enough for its peers to take it for silent."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from quorumlog.replica.client.connection import Connection
from quorumlog.replica.node.cluster import LocalCluster
from quorumlog.replica.protocol import ApiKey
from quorumlog.replica.protocol import messages as m

PARTITIONS = 4000
CLIENTS = 16


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_other_requests_are_answered_between_slices_of_many_metadata_answers(
    tmp_path: Path,
) -> None:
    with LocalCluster(1, tmp_path, log_level="WARNING") as c:
        c.create_topic("t", PARTITIONS, timeout_s=60)
        port = c.ports[1]
        conns = [
            Connection(c.host, port, client_id="slices", timeout_s=30) for _ in range(CLIENTS + 1)
        ]
        probe = conns.pop()
        try:

            def metadata(conn: Connection) -> m.MetadataResponse:
                return conn.receive(
                    conn.send(ApiKey.METADATA, m.MetadataRequest(topics=["t"])), m.MetadataResponse
                )

            def api_versions() -> float:
                t0 = time.monotonic()
                probe.receive(
                    probe.send(ApiKey.API_VERSIONS, m.ApiVersionsRequest()), m.ApiVersionsResponse
                )
                return time.monotonic() - t0

            alone = []
            for _ in range(3):
                t0 = time.monotonic()
                assert len(metadata(conns[0]).topics[0].partitions) == PARTITIONS
                alone.append(time.monotonic() - t0)
            one = min(alone)
            waits = []
            for _ in range(3):
                t0 = time.monotonic()
                sent = [
                    (conn, conn.send(ApiKey.METADATA, m.MetadataRequest(topics=["t"])))
                    for conn in conns
                ]
                time.sleep(one / 2)  # the node is reading them, and building
                waits.append(api_versions())
                for conn, cid in sent:
                    resp = conn.receive(cid, m.MetadataResponse)
                    assert len(resp.topics[0].partitions) == PARTITIONS
                all_of_them = time.monotonic() - t0
                assert all_of_them > 4 * one, (all_of_them, one)  # they queue up
            # Built whole, the probe waited for most of the CLIENTS answers to be built.
            assert min(waits) < 2 * one, (waits, one)
        finally:
            for conn in [*conns, probe]:
                conn.close()
