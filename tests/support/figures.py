"""Checks of what a ``quorumlog perf ... --json`` run reports. A time or a rate is only
checked to be reported as a number: its value depends on the machine and its load, so a
bound on it (from above or below) would fail on a loaded CI machine, not on a bug."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def is_number(value: Any) -> bool:
    """An int or a float, finite (not NaN, not infinite); a bool is not a number here."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def assert_numbers(figures: Mapping[str, Any], *keys: str) -> None:
    """Each of ``keys`` is in ``figures`` and reported as a finite number."""
    bad = {k: figures.get(k, "<missing>") for k in keys if not is_number(figures.get(k))}
    assert not bad, f"figures not reported as finite numbers: {bad}"
