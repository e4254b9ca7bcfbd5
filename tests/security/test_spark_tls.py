"""The Spark source reads over TLS with SCRAM authentication, end to end."""

from __future__ import annotations

from typing import Any

import pytest
from quorumlog.connector.options import QuorumLogOptionError, parse_options
from quorumlog.replica.node.cluster import LocalCluster

from tests.support.spark import source

pytestmark = [pytest.mark.cluster, pytest.mark.spark]


def as_reader(cluster: LocalCluster) -> dict[str, str]:
    """The source options that read as principal "reader" over TLS."""
    secret_file = str(cluster.secret_file("reader"))
    return {"tlsCaFile": cluster.ca_file, "principal": "reader", "secretFile": secret_file}


def test_batch_read_over_tls_with_auth(spark: Any, secure_cluster: LocalCluster) -> None:
    df = source(
        spark, secure_cluster, "granted", endingOffsets="latest", **as_reader(secure_cluster)
    )
    values = [r.value for r in df.orderBy("offset").collect()]
    assert values[:3] == [b"a", b"b", b"c"]
    # The query plan names where the secret lives, never the secret.
    plan = df._jdf.queryExecution().toString()
    assert secure_cluster.secrets["reader"] not in plan


def test_spark_read_without_grant_fails_clearly(spark: Any, secure_cluster: LocalCluster) -> None:
    df = source(spark, secure_cluster, "other", **as_reader(secure_cluster))
    with pytest.raises(Exception, match="AUTHORIZATION_FAILED"):
        df.collect()


def test_security_options_are_checked() -> None:
    base = {"bootstrap": "127.0.0.1:1", "topic": "t"}
    assert parse_options(base).security is None
    opts = parse_options({**base, "tlsCaFile": "ca.pem", "principal": "p", "secretEnv": "S"})
    assert opts.security is not None and opts.security.secret_env == "S"
    with pytest.raises(QuorumLogOptionError, match="exactly one of 'secretFile'"):
        parse_options({**base, "principal": "p"})
    with pytest.raises(QuorumLogOptionError, match="go together"):
        parse_options({**base, "tlsCaFile": "ca", "tlsCertFile": "c"})
    with pytest.raises(QuorumLogOptionError, match="need option 'principal'"):
        parse_options({**base, "secretFile": "f"})
    # A plain secret is accepted, but never shown by repr (plans print option objects).
    opts = parse_options({**base, "principal": "p", "secret": "hunter2"})
    assert opts.security is not None and "hunter2" not in repr(opts)
