"""``quorumlog serve --peer-address``: where raft traffic to a peer goes (the chaos proxies)."""

from __future__ import annotations

import pytest
from quorumlog.replica.cli.main import build_parser
from quorumlog.replica.node.config import NodeConfig, parse_peer_addresses

VOTERS = "1@127.0.0.1:9001,2@127.0.0.1:9002,3@127.0.0.1:9003"
SECRET_ENV = "QUORUMLOG_TEST_CLUSTER_SECRET"


@pytest.fixture(autouse=True)
def _cluster_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    # A plaintext cluster of several voters needs its cluster secret.
    monkeypatch.setenv(SECRET_ENV, "test-cluster-secret")


def _config(*extra: str) -> NodeConfig:
    args = build_parser().parse_args(
        ["serve", "--node-id", "1", "--listen", "127.0.0.1:9001", "--voters", VOTERS,
         "--data-dir", "/tmp/x", "--cluster-id", "c", "--cluster-secret-env", SECRET_ENV,
         *extra]
    )  # fmt: skip
    return NodeConfig.from_args(args)


def test_default_is_the_voters_addresses() -> None:
    assert _config().peer_addresses == {}


def test_repeatable_and_comma_lists() -> None:
    cfg = _config("--peer-address", "2@127.0.0.1:7002", "--peer-address", "3@127.0.0.1:7003")
    assert cfg.peer_addresses == {2: ("127.0.0.1", 7002), 3: ("127.0.0.1", 7003)}
    assert parse_peer_addresses(["2@h:1, 3@h:2"]) == {2: ("h", 1), 3: ("h", 2)}
    assert cfg.voters[2] == ("127.0.0.1", 9002)  # Metadata still advertises --voters


@pytest.mark.parametrize("bad", ["2@nowhere", "x@h:1", "2:h:1"])
def test_malformed_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="peer"):
        parse_peer_addresses([bad])


def test_unknown_peer_is_refused() -> None:
    with pytest.raises(ValueError, match="not --voters"):
        _config("--peer-address", "9@127.0.0.1:7009")
