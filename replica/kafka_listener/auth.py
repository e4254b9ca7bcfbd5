"""Authentication and authorization on the Kafka listener of a node with ``--auth-config``.

Authentication is SASL/SCRAM as a Kafka broker runs it (``SaslServerAuthenticator``):
before anything else a connection may send ApiVersions, then SaslHandshake naming
SCRAM-SHA-256 or SCRAM-SHA-512, then the SCRAM exchange: in SaslAuthenticate requests
after a SaslHandshake v1, or as bare size-prefixed tokens after a v0 one. Any other
request before that, or out of that order, closes the connection (Kafka's
IllegalSaslStateException); so does a failed exchange, after its SaslAuthenticate answer
with SASL_AUTHENTICATION_FAILED. ``KafkaSasl`` is one connection's part of this, without
I/O: ``KafkaServer`` hands it the requests until it names the principal.

Authorization applies the native listener's rules (``security.authorize_api``) to every
topic a request names: a topic the principal may not use is answered
TOPIC_AUTHORIZATION_FAILED here and the rest of the request goes to its handler
(``TopicGate``), as Kafka's KafkaApis splits authorized from unauthorized topics. Metadata
and DescribeConfigs show a principal only the topics it may use (admins: all), broker
configs only to admins; topic administration is for admins. APIs without a rule here are
open to every authenticated principal, as ApiVersions and Metadata are natively.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

from ..kafka import messages as km
from ..kafka.codec import fetched_partition
from ..kafka.errors import KafkaError
from ..kafka.schema import Api as KafkaApi
from ..kafka.schema import Message
from ..node.problems import LogBudget
from ..node.security import AuthConfig, Principal, authorize_api
from ..protocol import ApiKey, scram

log = logging.getLogger(__name__)

Handler = Callable[[KafkaApi, int, Message], Awaitable[Message | None]]

#: Offered in SaslHandshake answers, in Kafka's order.
SASL_MECHANISMS = tuple(scram.MECHANISMS)

#: DescribeConfigs resource types (org.apache.kafka.common.config.ConfigResource.Type).
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4


class SaslStateError(Exception):
    """A request the SASL state does not allow: the connection closes unanswered."""


class _State(Enum):
    HANDSHAKE = "handshake"  # ApiVersions or SaslHandshake
    CLIENT_FIRST = "client-first"
    CLIENT_FINAL = "client-final"
    DONE = "done"
    FAILED = "failed"


class SaslAnswer(NamedTuple):
    """What to send (a response body, raw token bytes, or nothing) and whether the
    connection closes after it."""

    body: Message | bytes | None
    close: bool = False


class KafkaSasl:
    """One connection's SASL/SCRAM state. ``principal`` is set once it authenticated."""

    def __init__(self, auth: AuthConfig, peer: object, budget: LogBudget) -> None:
        self.auth = auth
        self.peer = peer
        self._budget = budget
        self._state = _State.HANDSHAKE
        self._mechanism = scram.SCRAM_SHA_256
        # SaslHandshake v0: the tokens then travel bare, without Kafka request headers.
        self.raw_tokens = False
        self._session: scram.ScramServerSession | None = None
        self._entry: tuple[Principal, scram.Verifier] | None = None
        self.principal: Principal | None = None

    @property
    def authenticated(self) -> bool:
        return self._state is _State.DONE

    @property
    def failed(self) -> bool:
        return self._state is _State.FAILED

    def allows_api_versions(self) -> bool:
        return self._state is _State.HANDSHAKE

    def refuse(self, what: str) -> SaslStateError:
        """The error that closes the connection for ``what`` in the present state."""
        self._state = _State.FAILED
        self._budget.log(
            logging.WARNING,
            "kafka connection from %s sent %s while its SASL state is %s; closing",
            self.peer,
            what,
        )
        return SaslStateError(f"{what} during SASL authentication")

    def handshake(self, version: int, body: Message) -> SaslAnswer:
        if self._state is not _State.HANDSHAKE:
            raise self.refuse("SaslHandshake")
        out = km.SASL_HANDSHAKE.default_response(version)
        out["mechanisms"] = list(SASL_MECHANISMS)
        mechanism = scram.MECHANISMS.get(body["mechanism"])
        if mechanism is None:
            # Kafka answers, then closes: the client learns what is offered.
            self._state = _State.FAILED
            out["error_code"] = int(KafkaError.UNSUPPORTED_SASL_MECHANISM)
            return SaslAnswer(out, close=True)
        self._mechanism = mechanism
        self.raw_tokens = version == 0
        self._state = _State.CLIENT_FIRST
        return SaslAnswer(out)

    def authenticate(self, version: int, body: Message) -> SaslAnswer:
        """A SaslAuthenticate request (after a SaslHandshake v1)."""
        if self.raw_tokens or self._state not in (_State.CLIENT_FIRST, _State.CLIENT_FINAL):
            raise self.refuse("SaslAuthenticate")
        token, error = self._step(bytes(body["auth_bytes"]))
        out = km.SASL_AUTHENTICATE.default_response(version)
        if error is not None:
            out["error_code"] = int(KafkaError.SASL_AUTHENTICATION_FAILED)
            out["error_message"] = error
            return SaslAnswer(out, close=True)
        out["auth_bytes"] = token
        return SaslAnswer(out)

    def raw_token(self, payload: bytes) -> SaslAnswer:
        """A bare token (after a SaslHandshake v0): answered bare; a failure just closes."""
        if not self.raw_tokens or self._state not in (_State.CLIENT_FIRST, _State.CLIENT_FINAL):
            raise self.refuse("a bare SASL token")
        token, error = self._step(payload)
        return SaslAnswer(None, close=True) if error is not None else SaslAnswer(token)

    def _step(self, token: bytes) -> tuple[bytes, str | None]:
        """One SCRAM step: (the server's token, None) or (b"", why it failed)."""
        name = "?"
        try:
            if self._state is _State.CLIENT_FIRST:

                def verifier_for(principal: str) -> scram.Verifier:
                    self._entry = self.auth.credential(principal, self._mechanism)
                    if self._entry is None:
                        return self.auth.decoy(principal, self._mechanism)
                    return self._entry[1]

                self._session = scram.ScramServerSession(
                    token, verifier_for, self._mechanism, nonce_suffix_ok=True
                )
                self._state = _State.CLIENT_FINAL
                return self._session.first_message(), None
            assert self._session is not None
            name = self._session.principal
            server_final = self._session.verify_client_final(token)
        except scram.ScramError as exc:
            self._state = _State.FAILED
            why = "unknown principal (or no credential for the mechanism)"
            if self._entry is not None or self._session is None:
                why = str(exc)
            self._budget.log(
                logging.WARNING,
                "kafka SASL %s authentication failed for principal %r from %s: %s",
                self._mechanism.name,
                name,
                self.peer,
                why,
            )
            return b"", (
                "Authentication failed during authentication due to invalid credentials "
                f"with SASL mechanism {self._mechanism.name}"
            )
        assert self._entry is not None
        self.principal = self._entry[0]
        self._state = _State.DONE
        log.debug(
            "kafka client %s authenticated as %r (%s) with %s",
            self.peer,
            self.principal.name,
            self.principal.kind,
            self._mechanism.name,
        )
        return server_final, None


# ---- authorization ---------------------------------------------------------------------


def may_see_topic(principal: Principal, topic: str) -> bool:
    """Whether Metadata and DescribeConfigs show ``topic`` to ``principal``."""
    return principal.kind == "admin" or principal.may_use_topic(topic)


def _denied(principal: Principal, api: ApiKey, topic: str) -> str | None:
    """Why ``principal`` may not call native ``api`` on ``topic`` (None: it may)."""
    return authorize_api(principal, api, lambda: topic)


def _denied_produce(p: Message, why: str) -> Message:
    return {
        "index": p["index"],
        "error_code": int(KafkaError.TOPIC_AUTHORIZATION_FAILED),
        "base_offset": -1,
        "log_append_time_ms": -1,
        "log_start_offset": -1,
        "record_errors": [],
        "error_message": why,
    }


def _denied_fetch(p: Message, why: str) -> Message:
    return fetched_partition(p["partition"], KafkaError.TOPIC_AUTHORIZATION_FAILED)


def _denied_list_offsets(p: Message, why: str) -> Message:
    return {
        "partition_index": p["partition_index"],
        "error_code": int(KafkaError.TOPIC_AUTHORIZATION_FAILED),
        "old_style_offsets": [],
        "timestamp": -1,
        "offset": -1,
        "leader_epoch": -1,
    }


def _denied_epoch(p: Message, why: str) -> Message:
    return {
        "error_code": int(KafkaError.TOPIC_AUTHORIZATION_FAILED),
        "partition": p["partition"],
        "leader_epoch": -1,
        "end_offset": -1,
    }


@dataclass(frozen=True)
class _TopicsShape:
    """Where a request of ``topics[]: name, partitions[]`` shape keeps them, and its answer."""

    native: ApiKey  # whose rule applies
    topics: str
    name: str
    partitions: str
    answer_topics: str
    answer_partitions: str
    denied_partition: Callable[[Message, str], Message]


_TOPIC_REQUESTS: dict[int, _TopicsShape] = {
    km.PRODUCE.key: _TopicsShape(
        ApiKey.PRODUCE,
        "topic_data",
        "name",
        "partition_data",
        "responses",
        "partition_responses",
        _denied_produce,
    ),
    km.FETCH.key: _TopicsShape(
        ApiKey.FETCH, "topics", "topic", "partitions", "responses", "partitions", _denied_fetch
    ),
    km.LIST_OFFSETS.key: _TopicsShape(
        ApiKey.LIST_OFFSETS,
        "topics",
        "name",
        "partitions",
        "topics",
        "partitions",
        _denied_list_offsets,
    ),
    km.OFFSET_FOR_LEADER_EPOCH.key: _TopicsShape(
        ApiKey.OFFSETS_FOR_LEADER_EPOCH,
        "topics",
        "topic",
        "partitions",
        "topics",
        "partitions",
        _denied_epoch,
    ),
}


#: APIs that create, change or delete topics: admin principals only.
_TOPIC_ADMIN = frozenset(
    api.key
    for api in (
        km.CREATE_TOPICS,
        km.DELETE_TOPICS,
        km.CREATE_PARTITIONS,
        km.ALTER_CONFIGS,
        km.INCREMENTAL_ALTER_CONFIGS,
    )
)


#: The requests that name a transactional id, and its field (Kafka's TransactionalId
#: resource): refused TRANSACTIONAL_ID_AUTHORIZATION_FAILED unless the principal may use it.
_TRANSACTIONAL_ID_FIELD = {
    km.INIT_PRODUCER_ID.key: "transactional_id",
    km.ADD_PARTITIONS_TO_TXN.key: "v3_and_below_transactional_id",
    km.ADD_OFFSETS_TO_TXN.key: "transactional_id",
    km.END_TXN.key: "transactional_id",
    km.TXN_OFFSET_COMMIT.key: "transactional_id",
}


def _transactional_id_denied(api: KafkaApi, version: int, body: Message) -> Message:
    code = int(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    out = api.default_response(version)
    if api.key == km.ADD_PARTITIONS_TO_TXN.key:
        out["results_by_topic_v3_and_below"] = [
            {
                "name": t["name"],
                "results_by_partition": [
                    {"partition_index": p, "partition_error_code": code} for p in t["partitions"]
                ],
            }
            for t in body["v3_and_below_topics"]
        ]
    elif api.key == km.TXN_OFFSET_COMMIT.key:
        out["topics"] = [
            {
                "name": t["name"],
                "partitions": [
                    {"partition_index": p["partition_index"], "error_code": code}
                    for p in t["partitions"]
                ],
            }
            for t in body["topics"]
        ]
    else:
        out["error_code"] = code
    return out


class TopicGate:
    """Runs a request of an authenticated principal: what it may not touch is answered
    with an authorization error here, the rest by ``handler``, in the request's order.
    ``topic_by_id``: the topic name a Fetch v13+ topic id stands for."""

    def __init__(self, topic_by_id: Callable[[Any], str | None]) -> None:
        self.topic_by_id = topic_by_id

    async def __call__(
        self, principal: Principal, api: KafkaApi, version: int, body: Message, handler: Handler
    ) -> Message | None:
        shape = _TOPIC_REQUESTS.get(api.key)
        if shape is not None:
            return await self._topics(principal, shape, api, version, body, handler)
        if api.key == km.METADATA.key:
            return await self._metadata(principal, api, version, body, handler)
        if api.key == km.DESCRIBE_CONFIGS.key:
            return await self._describe_configs(principal, api, version, body, handler)
        if api.key in _TOPIC_ADMIN and principal.kind != "admin":
            return _admin_only(api, version, body, principal)
        if api.key in (km.DELETE_GROUPS.key, km.OFFSET_DELETE.key) and principal.kind != "admin":
            return _groups_admin_only(api, version, body)
        txn_field = _TRANSACTIONAL_ID_FIELD.get(api.key)
        if txn_field is not None:
            tid = body[txn_field]
            if tid is not None and not principal.may_use_transactional_id(tid):
                return _transactional_id_denied(api, version, body)
        if api.key == km.INIT_PRODUCER_ID.key and principal.kind not in ("producer", "admin"):
            # Kafka's answer without the IdempotentWrite ACL.
            out = api.default_response(version)
            out["error_code"] = int(KafkaError.CLUSTER_AUTHORIZATION_FAILED)
            return out
        return await handler(api, version, body)

    async def _topics(
        self,
        principal: Principal,
        shape: _TopicsShape,
        api: KafkaApi,
        version: int,
        body: Message,
        handler: Handler,
    ) -> Message | None:
        names: list[str | None] = [
            t.get(shape.name) or self.topic_by_id(t.get("topic_id")) for t in body[shape.topics]
        ]
        # A topic id naming no topic: the handler answers it as unknown.
        why = [None if not name else _denied(principal, shape.native, name) for name in names]
        if not any(why):
            return await handler(api, version, body)
        allowed = [t for t, w in zip(body[shape.topics], why, strict=True) if w is None]
        answer = await handler(api, version, {**body, shape.topics: allowed})
        if answer is None:
            return None  # a Produce with acks=0
        answered = iter(answer[shape.answer_topics])
        merged = []
        for t, name, w in zip(body[shape.topics], names, why, strict=True):
            if w is None:
                merged.append(next(answered))
                continue
            entry = {
                shape.name: name,
                shape.answer_partitions: [
                    shape.denied_partition(p, w) for p in t[shape.partitions]
                ],
            }
            if "topic_id" in t:
                entry["topic_id"] = t["topic_id"]
            merged.append(entry)
        answer[shape.answer_topics] = merged
        return answer

    async def _metadata(
        self, principal: Principal, api: KafkaApi, version: int, body: Message, handler: Handler
    ) -> Message | None:
        answer = await handler(api, version, body)
        if answer is None or principal.kind == "admin":
            return answer
        kept = []
        for t in answer["topics"]:
            if may_see_topic(principal, t["name"]):
                kept.append(t)
            elif body["topics"] is not None:  # named: say why; all topics: leave it out
                kept.append(
                    {
                        **t,
                        "error_code": int(KafkaError.TOPIC_AUTHORIZATION_FAILED),
                        "topic_id": uuid.UUID(int=0),
                        "partitions": [],
                    }
                )
        answer["topics"] = kept
        return answer

    async def _describe_configs(
        self, principal: Principal, api: KafkaApi, version: int, body: Message, handler: Handler
    ) -> Message | None:
        def denied(r: Message) -> KafkaError | None:
            if r["resource_type"] == RESOURCE_TOPIC:
                if may_see_topic(principal, r["resource_name"]):
                    return None
                return KafkaError.TOPIC_AUTHORIZATION_FAILED
            if r["resource_type"] == RESOURCE_BROKER and principal.kind != "admin":
                return KafkaError.CLUSTER_AUTHORIZATION_FAILED
            return None

        errors = [denied(r) for r in body["resources"]]
        if not any(errors):
            return await handler(api, version, body)
        allowed = [r for r, e in zip(body["resources"], errors, strict=True) if e is None]
        answer = await handler(api, version, {**body, "resources": allowed})
        assert answer is not None
        answered = iter(answer["results"])
        answer["results"] = [
            next(answered)
            if e is None
            else config_result(r, e, f"principal {principal.name!r} may not describe it")
            for r, e in zip(body["resources"], errors, strict=True)
        ]
        return answer


def config_result(resource: Message, error: KafkaError, message: str | None) -> Message:
    """A DescribeConfigs result for ``resource`` that carries only an error."""
    return {
        "error_code": int(error),
        "error_message": message,
        "resource_type": resource["resource_type"],
        "resource_name": resource["resource_name"],
        "configs": [],
    }


def _groups_admin_only(api: KafkaApi, version: int, body: Message) -> Message:
    """DeleteGroups / OffsetDelete from a principal that is not an admin: refused with
    GROUP_AUTHORIZATION_FAILED (Kafka's answer without the DELETE ACL on the group)."""
    code = int(KafkaError.GROUP_AUTHORIZATION_FAILED)
    out = api.default_response(version)
    if api.key == km.DELETE_GROUPS.key:
        out["results"] = [{"group_id": g, "error_code": code} for g in body["groups_names"]]
    else:
        out["error_code"] = code
    return out


def _admin_only(api: KafkaApi, version: int, body: Message, principal: Principal) -> Message:
    """A topic admin API (CreateTopics, DeleteTopics, CreatePartitions, AlterConfigs,
    IncrementalAlterConfigs) from a principal that is not an admin: every topic is answered
    TOPIC_AUTHORIZATION_FAILED (Kafka's answer without the CREATE / DELETE / ALTER ACL)."""
    code = int(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    why = f"only admin principals may call {api.name}; {principal.name!r} is a {principal.kind}"
    out = api.default_response(version)
    if api.key == km.CREATE_TOPICS.key:
        out["topics"] = [
            {
                "name": t["name"],
                "topic_id": uuid.UUID(int=0),
                "error_code": code,
                "error_message": why,
                "num_partitions": -1,
                "replication_factor": -1,
                "configs": None,
            }
            for t in body["topics"]
        ]
        return out
    if api.key == km.CREATE_PARTITIONS.key:
        out["results"] = [
            {"name": t["name"], "error_code": code, "error_message": why} for t in body["topics"]
        ]
        return out
    if api.key in (km.ALTER_CONFIGS.key, km.INCREMENTAL_ALTER_CONFIGS.key):
        out["responses"] = [
            {
                "error_code": code,
                "error_message": why,
                "resource_type": r["resource_type"],
                "resource_name": r["resource_name"],
            }
            for r in body["resources"]
        ]
        return out
    named = [(n, uuid.UUID(int=0)) for n in body["topic_names"]]
    named += [(t["name"], t["topic_id"]) for t in body["topics"]]
    out["responses"] = [
        {"name": name, "topic_id": topic_id, "error_code": code, "error_message": why}
        for name, topic_id in named
    ]
    return out
