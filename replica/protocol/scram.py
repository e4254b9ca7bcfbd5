"""SCRAM-SHA-256 (RFC 5802 / RFC 7677) as pure functions over the exchange's messages.

The client proves it knows the secret without sending it: the server stores only
``salt``, ``iterations``, ``StoredKey = H(ClientKey)`` and ``ServerKey``; the client sends
``ClientProof = ClientKey XOR HMAC(StoredKey, AuthMessage)``; the server answers with
``ServerSignature = HMAC(ServerKey, AuthMessage)`` so the client knows the server holds the
verifier too. ``AuthMessage`` contains a fresh server nonce, so a replayed exchange fails.
No sockets here: the node and the client each drive these functions over their own I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096
MIN_ITERATIONS = 4096
_GS2_HEADER = "n,,"
_CHANNEL_BINDING = base64.b64encode(_GS2_HEADER.encode()).decode()  # "biws"


class ScramError(ValueError):
    """A malformed SCRAM message or a failed verification (the message never says which
    of principal and secret was wrong)."""


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


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


def salted_password(secret: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", secret.encode(), salt, iterations)


@dataclass(frozen=True, slots=True)
class Verifier:
    """What a node stores for a principal: enough to check a proof, not to make one."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_json(self) -> dict[str, object]:
        return {
            "mechanism": MECHANISM,
            "salt": _b64(self.salt),
            "iterations": self.iterations,
            "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key),
        }

    @staticmethod
    def from_json(obj: dict[str, object]) -> Verifier:
        if obj.get("mechanism", MECHANISM) != MECHANISM:
            raise ScramError(f"unsupported mechanism {obj.get('mechanism')!r}")
        iterations = obj.get("iterations")
        if not isinstance(iterations, int) or iterations < MIN_ITERATIONS:
            raise ScramError(f"iterations must be an integer >= {MIN_ITERATIONS}")
        fields = {}
        for name in ("salt", "stored_key", "server_key"):
            value = obj.get(name)
            if not isinstance(value, str):
                raise ScramError(f"{name} must be a base64 string")
            fields[name] = _unb64(value, name)
        return Verifier(fields["salt"], iterations, fields["stored_key"], fields["server_key"])


def make_verifier(
    secret: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
) -> Verifier:
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = salted_password(secret, salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    return Verifier(salt, iterations, _h(client_key), _hmac(salted, b"Server Key"))


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
        salted = salted_password(self.secret, _unb64(salt_text, "salt"), iterations)
        client_key = _hmac(salted, b"Client Key")
        without_proof = f"c={_CHANNEL_BINDING},r={nonce}"
        auth_message = f"{self._client_first_bare},{text},{without_proof}".encode()
        proof = _xor(client_key, _hmac(_h(client_key), auth_message))
        self._expected_server_signature = _hmac(_hmac(salted, b"Server Key"), auth_message)
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
    """One exchange on one connection; ``verifier`` may be a decoy for an unknown
    principal (so unknown principals and wrong secrets fail alike, at the final step)."""

    principal: str
    client_nonce: str
    verifier: Verifier
    known: bool
    server_nonce: str = ""
    _client_first_bare: str = ""
    _server_first: str = ""

    def first_message(self) -> bytes:
        self.server_nonce = self.client_nonce + new_nonce()
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
        if attrs.get("r") != self.server_nonce:
            raise ScramError("nonce mismatch (stale or replayed exchange)")
        proof = _unb64(proof_part, "proof")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        if len(proof) != len(self.verifier.stored_key):
            raise ScramError("authentication failed")
        client_key = _xor(proof, _hmac(self.verifier.stored_key, auth_message))
        if not self.known or not hmac.compare_digest(_h(client_key), self.verifier.stored_key):
            raise ScramError("authentication failed")
        return f"v={_b64(_hmac(self.verifier.server_key, auth_message))}".encode()


def decoy_verifier(principal: str, key: bytes) -> Verifier:
    """A stable fake verifier for an unknown principal: the same salt every time, so a
    prober cannot tell unknown principals from known ones by the server-first message."""
    salt = _hmac(key, b"salt:" + principal.encode())[:16]
    return Verifier(salt, DEFAULT_ITERATIONS, _hmac(key, b"sk:" + principal.encode()), b"")
