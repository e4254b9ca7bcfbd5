"""``make chaos SEED=s DURATION=d``: one fault campaign; prints one line with the counts
(and, on failure, the seed, the schedule, what was applied and examples of each anomaly)."""

from __future__ import annotations

import argparse
import logging
import sys

from tests.support.spark import build_spark_session

from .campaign import Campaign


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--mode", choices=["clean", "unclean"], default="clean")
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    spark = build_spark_session(app="quorumlog-chaos")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        result = Campaign(
            spark,
            seed=args.seed,
            duration_s=args.duration,
            nodes=args.nodes,
            partitions=args.partitions,
            mode=args.mode,
        ).run()
    finally:
        spark.stop()
    print(result.line() if result.ok else result.report(), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
