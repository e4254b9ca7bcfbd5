"""Nodes' Prometheus endpoints read as Prometheus does: fetched over HTTP and parsed by
prometheus-client's own text parser."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from quorumlog.replica.node.cluster import LocalCluster

#: sample name -> [(labels, value)], as one scrape found them.
Scrape = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str, timeout_s: float = 5.0) -> Scrape:
    """Every sample the endpoint at ``url`` serves, by sample name."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        text = resp.read().decode()
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(found: Scrape, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
    return sum(
        v for have, v in found.get(name, []) if all(have.get(k) == x for k, x in labels.items())
    )


def cluster_total(
    cluster: LocalCluster, name: str, nodes: Iterable[int] | None = None, **labels: str
) -> float:
    """``value`` summed over the scrapes of ``nodes`` (default: every running node)."""
    which = [n for n in (cluster.metrics_urls if nodes is None else nodes) if cluster.is_running(n)]
    return sum(value(scrape(cluster.metrics_urls[n]), name, **labels) for n in which)
