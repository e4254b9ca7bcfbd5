"""Calls watched as they happen: a function on a module replaced (through pytest's
monkeypatch, so undone after the test) by one that records each call and still makes it."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
from quorumlog.replica.client.connection import Connection
from quorumlog.replica.protocol import ApiKey


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


class Answered(NamedTuple):
    port: int  # the node's
    request: Any  # a MetadataRequest
    response: Any  # its MetadataResponse


def record_metadata(monkeypatch: pytest.MonkeyPatch) -> list[Answered]:
    """Every Metadata request a client connection gets an answer to from now on, in
    order."""
    answered: list[Answered] = []
    real = Connection.request

    def request(self: Connection, api: ApiKey, req: Any, cls: Any) -> Any:
        resp = real(self, api, req, cls)
        if api == ApiKey.METADATA:
            answered.append(Answered(self.port, req, resp))
        return resp

    monkeypatch.setattr(Connection, "request", request)
    return answered
