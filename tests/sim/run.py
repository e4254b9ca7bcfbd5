"""``python -m tests.sim.run --seeds N`` (or ``--seed S`` to replay one, with its trace).

Prints ``N seeds, V violations``; each violation prints its seed, the invariant, the
injected faults and the trailing events. Exit status 1 if any seed violated.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import multiprocessing
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .cluster import SimResult, run_seed


def _run_with(options: dict[str, Any], seed: int) -> SimResult:
    return run_seed(seed, **options)


def each_seed(
    seeds: Iterable[int], workers: int | None = None, **options: Any
) -> Iterator[SimResult]:
    """``run_seed(seed, **options)`` of every seed, in seed order, over ``workers``
    processes (one per core; a teeth test that stops at its first violation takes half
    the time on two). A caller may stop at any result: closing the generator ends the
    pool and the seeds it ran ahead."""
    workers = workers or os.cpu_count() or 1
    run = functools.partial(_run_with, options)
    if workers == 1:
        yield from map(run, seeds)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap(run, seeds)


def run_many(
    first: int, count: int, workers: int | None = None
) -> tuple[list[SimResult], Counter[str]]:
    """Seeds first..first+count-1, over ``workers`` processes (one per core): the
    failures in seed order and the summed stats."""
    failures: list[SimResult] = []
    totals: Counter[str] = Counter()
    for result in each_seed(range(first, first + count), workers):
        totals.update({k: v for k, v in result.stats.items() if isinstance(v, int)})
        if result.violation is not None:
            failures.append(result)
    return failures, totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim.run")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--seeds", type=int, default=1000, help="run seeds 0..N-1")
    group.add_argument("--seed", type=int, help="replay one seed and print its summary")
    parser.add_argument("--first", type=int, default=0, help="first seed of --seeds")
    parser.add_argument("--verbose", action="store_true", help="log the cores (DEBUG)")
    parser.add_argument(
        "--report",
        type=Path,
        help="also write the violations' reports and the summed stats "
        "to this JSON file (for the test that collects a sweep run in the background)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.CRITICAL)
    started = time.monotonic()
    if args.seed is not None:
        result = run_seed(args.seed)
        if result.violation is not None:
            print(result.report())
            return 1
        print(f"seed {args.seed}: ok {result.stats}")
        print("faults injected:")
        for f in result.faults:
            print(f"  {f}")
        return 0
    failures, totals = run_many(args.first, args.seeds)
    if args.report is not None:
        reports = [result.report() for result in failures]
        args.report.write_text(json.dumps({"failures": reports, "stats": dict(totals)}))
    for result in failures:
        print(result.report())
        print()
    elapsed = time.monotonic() - started
    print(
        f"{args.seeds} seeds, {len(failures)} violations ({elapsed:.1f} s); "
        f"{totals['acked']} records acknowledged, {totals['fetched']} consumer fetches served"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
