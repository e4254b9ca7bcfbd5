"""SCRAM (RFC 5802) with SHA-256 (RFC 7677) or SHA-512, as pure functions over the
exchange's messages.

The client proves it knows the secret without sending it: the server stores only
``salt``, ``iterations``, ``StoredKey = H(ClientKey)`` and ``ServerKey``; the client sends
``ClientProof = ClientKey XOR HMAC(StoredKey, AuthMessage)``; the server answers with
``ServerSignature = HMAC(ServerKey, AuthMessage)`` so the client knows the server holds the
verifier too. ``AuthMessage`` contains a fresh server nonce, so a replayed exchange fails.
A verifier is made for one hash (its ``mechanism``) and checks exchanges of that hash only.
No sockets here: the node and the client each drive these functions over their own I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Mechanism:
    """A SCRAM mechanism: its SASL name and the hash every step of it uses."""

    name: str
    hash_name: str

    def h(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self.hash_name).digest()

    def salted_password(self, secret: str, salt: bytes, iterations: int) -> bytes:
        return hashlib.pbkdf2_hmac(self.hash_name, secret.encode(), salt, iterations)


SCRAM_SHA_256 = Mechanism("SCRAM-SHA-256", "sha256")
SCRAM_SHA_512 = Mechanism("SCRAM-SHA-512", "sha512")
#: By SASL name; Kafka offers both and stores a credential per mechanism.
MECHANISMS: dict[str, Mechanism] = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
#: The native protocol's mechanism (nodes and native clients).
MECHANISM = SCRAM_SHA_256.name
DEFAULT_ITERATIONS = 4096
MIN_ITERATIONS = 4096
_GS2_HEADER = "n,,"
_CHANNEL_BINDING = base64.b64encode(_GS2_HEADER.encode()).decode()  # "biws"


class ScramError(ValueError):
    """A malformed SCRAM message or a failed verification (the message never says which
    of principal and secret was wrong)."""


def mechanism_named(name: object) -> Mechanism:
    mechanism = MECHANISMS.get(name) if isinstance(name, str) else None
    if mechanism is None:
        raise ScramError(f"unsupported mechanism {name!r}; expected one of {sorted(MECHANISMS)}")
    return mechanism


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode(), validate=True)
    except ValueError as exc:
        raise ScramError(f"{what} is not base64") from exc


def new_nonce() -> str:
    return secrets.token_urlsafe(24)


def salted_password(
    secret: str, salt: bytes, iterations: int, mechanism: Mechanism = SCRAM_SHA_256
) -> bytes:
    return mechanism.salted_password(secret, salt, iterations)


@dataclass(frozen=True, slots=True)
class Verifier:
    """What a node stores for a principal: enough to check a proof, not to make one."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes
    mechanism: Mechanism = SCRAM_SHA_256

    def to_json(self) -> dict[str, object]:
        return {
            "mechanism": self.mechanism.name,
            "salt": _b64(self.salt),
            "iterations": self.iterations,
            "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key),
        }

    @staticmethod
    def from_json(obj: dict[str, object]) -> Verifier:
        mechanism = mechanism_named(obj.get("mechanism", MECHANISM))
        iterations = obj.get("iterations")
        if not isinstance(iterations, int) or iterations < MIN_ITERATIONS:
            raise ScramError(f"iterations must be an integer >= {MIN_ITERATIONS}")
        fields = {}
        for name in ("salt", "stored_key", "server_key"):
            value = obj.get(name)
            if not isinstance(value, str):
                raise ScramError(f"{name} must be a base64 string")
            fields[name] = _unb64(value, name)
        size = len(mechanism.h(b""))
        if len(fields["stored_key"]) != size or len(fields["server_key"]) != size:
            raise ScramError(f"stored_key and server_key must be {size} bytes for {mechanism.name}")
        return Verifier(
            fields["salt"], iterations, fields["stored_key"], fields["server_key"], mechanism
        )


def make_verifier(
    secret: str,
    *,
    iterations: int = DEFAULT_ITERATIONS,
    salt: bytes | None = None,
    mechanism: Mechanism = SCRAM_SHA_256,
) -> Verifier:
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = mechanism.salted_password(secret, salt, iterations)
    client_key = mechanism.hmac(salted, b"Client Key")
    return Verifier(
        salt,
        iterations,
        mechanism.h(client_key),
        mechanism.hmac(salted, b"Server Key"),
        mechanism,
    )


def _attrs(message: str, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise ScramError(f"malformed {what}")
        out[key] = value
    return out


def _escape_name(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _unescape_name(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


# ---- client side ---------------------------------------------------------------------


@dataclass
class ScramClient:
    principal: str
    secret: str
    client_nonce: str = ""
    _client_first_bare: str = ""
    _expected_server_signature: bytes = b""
    mechanism: Mechanism = field(default=SCRAM_SHA_256, kw_only=True)

    def first_message(self) -> bytes:
        self.client_nonce = self.client_nonce or new_nonce()
        self._client_first_bare = f"n={_escape_name(self.principal)},r={self.client_nonce}"
        return (_GS2_HEADER + self._client_first_bare).encode()

    def final_message(self, server_first: bytes) -> bytes:
        text = server_first.decode(errors="replace")
        attrs = _attrs(text, "server-first message")
        nonce, salt_text, iters = attrs.get("r"), attrs.get("s"), attrs.get("i")
        if nonce is None or salt_text is None or iters is None or not iters.isdigit():
            raise ScramError("malformed server-first message")
        if not nonce.startswith(self.client_nonce) or len(nonce) <= len(self.client_nonce):
            raise ScramError("server nonce does not extend the client nonce")
        iterations = int(iters)
        if iterations < MIN_ITERATIONS:
            raise ScramError(f"server asked for {iterations} iterations (< {MIN_ITERATIONS})")
        m = self.mechanism
        salted = m.salted_password(self.secret, _unb64(salt_text, "salt"), iterations)
        client_key = m.hmac(salted, b"Client Key")
        without_proof = f"c={_CHANNEL_BINDING},r={nonce}"
        auth_message = f"{self._client_first_bare},{text},{without_proof}".encode()
        proof = _xor(client_key, m.hmac(m.h(client_key), auth_message))
        self._expected_server_signature = m.hmac(m.hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={_b64(proof)}".encode()

    def verify_server_final(self, server_final: bytes) -> None:
        attrs = _attrs(server_final.decode(errors="replace"), "server-final message")
        if "e" in attrs:
            raise ScramError(f"server rejected the exchange: {attrs['e']}")
        signature = _unb64(attrs.get("v", ""), "server signature")
        if not hmac.compare_digest(signature, self._expected_server_signature):
            raise ScramError(
                "server signature does not verify: the node does not hold our verifier"
            )


# ---- server side ---------------------------------------------------------------------


def parse_client_first(message: bytes) -> tuple[str, str]:
    """Return (principal, client nonce)."""
    text = message.decode(errors="replace")
    if not text.startswith(_GS2_HEADER):
        raise ScramError("client-first message must start with 'n,,' (no channel binding)")
    attrs = _attrs(text[len(_GS2_HEADER) :], "client-first message")
    name, nonce = attrs.get("n"), attrs.get("r")
    if not name or not nonce:
        raise ScramError("client-first message needs n= and r=")
    return _unescape_name(name), nonce


@dataclass
class ScramServerSession:
    """One exchange on one connection, in the hash of ``verifier``, which may be a decoy
    for an unknown principal (so unknown principals and wrong secrets fail alike, at the
    final step)."""

    principal: str
    client_nonce: str
    verifier: Verifier
    known: bool
    server_nonce: str = ""
    # Take a client-final nonce that only ends with the combined nonce, as Kafka's brokers
    # do (``ScramSaslServer``): librdkafka 2.0 (Debian's, kcat's) sends its client nonce
    # twice. The fresh server part still ends it and the proof covers it, so a replay
    # fails as before. Off for the native protocol.
    nonce_suffix_ok: bool = field(default=False, kw_only=True)
    _client_first_bare: str = ""
    _server_first: str = ""

    def first_message(self, nonce: str | None = None) -> bytes:
        """The server-first message. ``nonce``: the server's part of the nonce, fresh
        unless given (a test replays a published exchange)."""
        self.server_nonce = self.client_nonce + (nonce or new_nonce())
        self._client_first_bare = f"n={_escape_name(self.principal)},r={self.client_nonce}"
        self._server_first = (
            f"r={self.server_nonce},s={_b64(self.verifier.salt)},i={self.verifier.iterations}"
        )
        return self._server_first.encode()

    def verify_client_final(self, message: bytes) -> bytes:
        """Check the proof; return the server-final message. Raises ``ScramError``."""
        text = message.decode(errors="replace")
        without_proof, sep, proof_part = text.rpartition(",p=")
        if not sep:
            raise ScramError("client-final message has no proof")
        attrs = _attrs(without_proof, "client-final message")
        if attrs.get("c") != _CHANNEL_BINDING:
            raise ScramError("unexpected channel binding")
        nonce = attrs.get("r") or ""
        if nonce != self.server_nonce and not (
            self.nonce_suffix_ok and nonce.endswith(self.server_nonce)
        ):
            raise ScramError("nonce mismatch (stale or replayed exchange)")
        proof = _unb64(proof_part, "proof")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        if len(proof) != len(self.verifier.stored_key):
            raise ScramError("authentication failed")
        m = self.verifier.mechanism
        client_key = _xor(proof, m.hmac(self.verifier.stored_key, auth_message))
        if not self.known or not hmac.compare_digest(m.h(client_key), self.verifier.stored_key):
            raise ScramError("authentication failed")
        return f"v={_b64(m.hmac(self.verifier.server_key, auth_message))}".encode()


def decoy_verifier(principal: str, key: bytes, mechanism: Mechanism = SCRAM_SHA_256) -> Verifier:
    """A stable fake verifier for an unknown principal: the same salt every time, so a
    prober cannot tell unknown principals from known ones by the server-first message.
    The native mechanism's decoy is what it always was; another's is keyed by its name
    too, and its keys have that hash's length, so its exchange fails the way a real
    one's does."""
    tag = b"" if mechanism == SCRAM_SHA_256 else mechanism.name.encode() + b":"
    salt = SCRAM_SHA_256.hmac(key, tag + b"salt:" + principal.encode())[:16]
    stored_key = mechanism.hmac(key, tag + b"sk:" + principal.encode())
    return Verifier(salt, DEFAULT_ITERATIONS, stored_key, b"", mechanism)
