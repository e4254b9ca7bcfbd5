"""``python -m tests.sim.run --seeds N`` (or ``--seed S`` to replay one, with its trace).

Prints ``N seeds, V violations``; each violation prints its seed, the invariant, the
injected faults and the trailing events. Exit status 1 if any seed violated.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from .cluster import SimResult, run_seed


def run_many(first: int, count: int, stop_at_first: bool = False) -> list[SimResult]:
    failures = []
    for seed in range(first, first + count):
        result = run_seed(seed)
        if result.violation is not None:
            failures.append(result)
            if stop_at_first:
                break
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim.run")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--seeds", type=int, default=1000, help="run seeds 0..N-1")
    group.add_argument("--seed", type=int, help="replay one seed and print its summary")
    parser.add_argument("--first", type=int, default=0, help="first seed of --seeds")
    parser.add_argument("--verbose", action="store_true", help="log the cores (DEBUG)")
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
    failures = run_many(args.first, args.seeds)
    for result in failures:
        print(result.report())
        print()
    elapsed = time.monotonic() - started
    print(f"{args.seeds} seeds, {len(failures)} violations ({elapsed:.1f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
