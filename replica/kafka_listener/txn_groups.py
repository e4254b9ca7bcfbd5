"""Transaction groups: one decision for the transactions of many producers (quorumlog's,
for a writer whose tasks each have a producer, as the Spark sink's; the pure rules are
``kafka.txn.group_commit``).

Group ``G``'s members are transactional ids ``G#...``, coordinated with ``G`` (on its
``__transaction_state`` partition): each task of the writer initialises its member, writes
its records in an ordinary transaction and leaves it open. The writer's driver then
decides the batch with one ``TxnGroupCommitRequest``: under the locks of the group and of
every member, the coordinator appends ONE record batch holding every member's
PrepareCommit (or PrepareAbort) and the group's new fence (the batch number), acks=quorum,
and only then answers; the markers follow as for any decision (``_finish_later``), and a
coordinator that takes over finishes them from the Prepare* records it loads. So a crash
before that append leaves every member open (each aborted by its timeout, or by the next
initialisation of its id), a crash after it leaves the decision whole; nothing in between
exists. A batch at or below the fence is a replay of one decided already: its members'
transactions abort and the fence stays (a replay writes nothing visible again).
"""

from __future__ import annotations

import contextlib

from ..kafka.errors import KafkaError
from ..kafka.txn import group_commit, group_of
from ..node.transport import REQUEST_PRINCIPAL
from ..protocol import messages as m
from .txn_coordinator import TransactionCoordinator, wall_ms


class TxnGroups:
    """The ``TXN_GROUP_COMMIT`` handler of a node's transaction coordinator."""

    def __init__(self, coordinator: TransactionCoordinator) -> None:
        self.coordinator = coordinator

    async def group_commit(self, req: m.TxnGroupCommitRequest) -> m.TxnGroupCommitResponse:
        refused = _refused(req)
        if refused is not None:
            return refused
        c = self.coordinator
        part, code = await c._coordinate(req.group)
        if part is None:
            return _answer(code, f"group {req.group!r}")
        tids = sorted({member.transactional_id for member in req.members})
        for tid in tids:
            await c._settled(part, tid)
        async with contextlib.AsyncExitStack() as locks:
            for tid in [req.group, *tids]:
                await locks.enter_async_context(c._lock(tid))
            decision = group_commit(
                part.fences.get(req.group, -1),
                req.batch,
                [
                    (part.txns.get(mb.transactional_id), mb.producer_id, mb.producer_epoch)
                    for mb in req.members
                ],
                req.commit,
                wall_ms(),
            )
            if decision.writes or decision.fence_moves:
                code = await c._write(
                    part,
                    None,
                    *decision.writes,
                    fence=(req.group, decision.fence) if decision.fence_moves else None,
                )
                if code != KafkaError.NONE:
                    return _answer(code, f"group {req.group!r}: the decision was not written")
                for meta in decision.writes:
                    c._finish_later(part, meta)
            return _answer(
                decision.error,
                f"group {req.group!r} batch {req.batch}",
                part.fences.get(req.group, -1),
            )


def _answer(code: KafkaError, what: str, fence: int = -1) -> m.TxnGroupCommitResponse:
    return m.TxnGroupCommitResponse(
        error=int(code),
        error_message="" if code == KafkaError.NONE else f"{what}: {code.name}",
        committed_batch=fence,
    )


def _refused(req: m.TxnGroupCommitRequest) -> m.TxnGroupCommitResponse | None:
    """A request naming a member of another group, or ids the principal may not use."""
    for member in req.members:
        if group_of(member.transactional_id) != req.group:
            return _answer(
                KafkaError.INVALID_REQUEST,
                f"{member.transactional_id!r} is not a member of group {req.group!r}",
            )
    principal, _ = REQUEST_PRINCIPAL.get()
    if principal is None:
        return None
    for tid in [req.group, *(mb.transactional_id for mb in req.members)]:
        if not principal.may_use_transactional_id(tid):
            return _answer(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, repr(tid))
    return None
