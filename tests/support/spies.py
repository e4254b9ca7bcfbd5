"""Calls watched as they happen: a function on a module replaced (through pytest's
monkeypatch, so undone after the test) by one that records each call and still makes it."""

from __future__ import annotations

from typing import Any

import pytest


def record_calls(monkeypatch: pytest.MonkeyPatch, owner: object, *names: str) -> list[Any]:
    """Wrap ``owner.<name>`` for each of ``names``: every call still runs the real function,
    and its first argument (a descriptor, a path) is appended, in call order, to the list
    returned."""
    calls: list[Any] = []
    for name in names:
        real = getattr(owner, name)

        def recording(first: Any, *rest: Any, real: Any = real) -> Any:
            calls.append(first)
            return real(first, *rest)

        monkeypatch.setattr(owner, name, recording)
    return calls
