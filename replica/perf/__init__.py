"""The benchmarks: ``quorumlog perf <name>``, one module per benchmark.

Each prints human-readable figures, then one JSON line of them with ``--json``;
``util`` holds what they share (progress, CPU and RSS counters, the JSON line).
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: ``quorumlog perf <name>`` -> the module of this package that runs it.
COMMANDS = {
    "storage": "storage",
    "produce": "produce",
    "failover": "failover",
    "spark-read": "spark",
    "delta": "delta",
    "kafka": "kafka",
    "partitions": "partitions",
    "latency": "latency",
    "producer": "producer",
    "reassign": "reassign",
    "transactions": "transactions",
    "sink": "sink",
    "compaction": "compaction",
}


def load(which: str) -> ModuleType:
    """The module that runs ``quorumlog perf <which>`` (its ``main(argv)`` runs it)."""
    return importlib.import_module(f"{__name__}.{COMMANDS[which]}")
