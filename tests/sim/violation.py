"""The simulator's one exception: an invariant broken, named as the checks name it."""

from __future__ import annotations


class Violation(Exception):
    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail

    def __reduce__(self) -> tuple[type[Violation], tuple[str, str]]:
        return Violation, (self.invariant, self.detail)  # results cross process pools
