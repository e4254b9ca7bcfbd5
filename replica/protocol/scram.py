"""SCRAM (RFC 5802) with SHA-256 (RFC 7677) or SHA-512: the exchange is ``scramp``'s
(the SCRAM library pg8000 uses); here are what a node stores and the two sides as the
node and the clients drive them over their own I/O.

The client proves it knows the secret without sending it: the server stores only
``salt``, ``iterations``, ``StoredKey = H(ClientKey)`` and ``ServerKey`` (a ``Verifier``);
the server's signature shows the client that the server holds the verifier too, and a
fresh server nonce makes a replayed exchange fail. A verifier is made for one hash (its
``mechanism``) and checks exchanges of that hash only. Secrets and principal names are
SASLprep'd, as RFC 5802 says (printable ASCII is unchanged).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import scramp
from scramp.core import Nonce


@dataclass(frozen=True, slots=True)
class Mechanism:
    """A SCRAM mechanism: its SASL name and the hash every step of it uses."""

    name: str
    hash_name: str

    def h(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self.hash_name).digest()


SCRAM_SHA_256 = Mechanism("SCRAM-SHA-256", "sha256")
SCRAM_SHA_512 = Mechanism("SCRAM-SHA-512", "sha512")
#: By SASL name; Kafka offers both and stores a credential per mechanism.
MECHANISMS: dict[str, Mechanism] = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
#: The native protocol's mechanism (nodes and native clients).
MECHANISM = SCRAM_SHA_256.name
DEFAULT_ITERATIONS = 4096
MIN_ITERATIONS = 4096


class ScramError(ValueError):
    """A malformed SCRAM message or a failed verification (the message never says which
    of principal and secret was wrong)."""


def mechanism_named(name: object) -> Mechanism:
    mechanism = MECHANISMS.get(name) if isinstance(name, str) else None
    if mechanism is None:
        raise ScramError(f"unsupported mechanism {name!r}; expected one of {sorted(MECHANISMS)}")
    return mechanism


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode(), validate=True)
    except ValueError as exc:
        raise ScramError(f"{what} is not base64") from exc


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
    with _scram_errors():
        salt, stored_key, server_key, iterations = scramp.ScramMechanism(
            mechanism.name
        ).make_auth_info(
            secret,
            iteration_count=iterations,
            salt=salt if salt is not None else secrets.token_bytes(16),
        )
    return Verifier(salt, iterations, stored_key, server_key, mechanism)


@contextmanager
def _scram_errors() -> Iterator[None]:
    """scramp's failures (and a message that is not UTF-8) as ``ScramError``."""
    try:
        yield
    except scramp.ScramException as exc:
        raise ScramError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise ScramError(f"a SCRAM message is not UTF-8: {exc}") from None


# ---- client side ---------------------------------------------------------------------


class ScramClient:
    """One exchange as a client: ``first_message``, then ``final_message`` of the
    server-first message, then ``verify_server_final``. ``client_nonce``: fresh unless
    given (a test replays a published exchange)."""

    def __init__(
        self,
        principal: str,
        secret: str,
        client_nonce: str = "",
        *,
        mechanism: Mechanism = SCRAM_SHA_256,
    ) -> None:
        self.principal = principal
        self.mechanism = mechanism
        with _scram_errors():
            self._exchange = scramp.ScramClient(
                [mechanism.name], principal, secret, c_nonce=client_nonce or None
            )

    def first_message(self) -> bytes:
        with _scram_errors():
            first: str = self._exchange.get_client_first()
        return first.encode()

    def final_message(self, server_first: bytes) -> bytes:
        with _scram_errors():
            self._exchange.set_server_first(server_first.decode())
            final: str = self._exchange.get_client_final()
        return final.encode()

    def verify_server_final(self, server_final: bytes) -> None:
        """Raises ``ScramError`` unless the server proved it holds our verifier."""
        with _scram_errors():
            self._exchange.set_server_final(server_final.decode())


# ---- server side ---------------------------------------------------------------------


class ScramServerSession:
    """One exchange on one connection, from the client-first message on: the principal
    it names is looked up with ``verifier_for``, which returns a decoy for a principal
    unknown here, so unknown principals and wrong secrets fail alike, at the final step.
    Raises ``ScramError`` for a malformed client-first message.

    ``nonce_suffix_ok``: take a client-final nonce that only ends with the combined
    nonce, as Kafka's brokers do (``ScramSaslServer``): librdkafka 2.0 (Debian's, kcat's)
    sends its client nonce twice. The fresh server part still ends it and the proof
    covers it, so a replay fails as before. Off for the native protocol. ``server_nonce``:
    the server's part of the nonce, fresh unless given (a test replays an exchange)."""

    def __init__(
        self,
        client_first: bytes,
        verifier_for: Callable[[str], Verifier],
        mechanism: Mechanism = SCRAM_SHA_256,
        *,
        nonce_suffix_ok: bool = False,
        server_nonce: str | None = None,
    ) -> None:
        self.principal = "?"
        self.mechanism = mechanism
        self.nonce_suffix_ok = nonce_suffix_ok

        def credential(name: str) -> tuple[bytes, bytes, bytes, int]:
            self.principal = name
            v = verifier_for(name)
            return v.salt, v.stored_key, v.server_key, v.iterations

        with _scram_errors():
            if not client_first.startswith(b"n,,"):
                raise ScramError("client-first message must start with 'n,,' (no channel binding)")
            self._exchange = scramp.ScramMechanism(mechanism.name).make_server(
                credential, s_nonce=server_nonce
            )
            self._exchange.set_client_first(client_first.decode())

    def first_message(self) -> bytes:
        """The server-first message."""
        with _scram_errors():
            first: str = self._exchange.get_server_first()
        return first.encode()

    def verify_client_final(self, message: bytes) -> bytes:
        """Check the proof; return the server-final message. Raises ``ScramError`` (the
        message never says which of principal and secret was wrong)."""
        with _scram_errors():
            text = message.decode()
            if self.nonce_suffix_ok:
                self._take_repeated_client_nonce(text)
            try:
                self._exchange.set_client_final(text)
            except scramp.ScramException as exc:
                if "nonce" in str(exc).lower():
                    raise ScramError("nonce mismatch (stale or replayed exchange)") from None
                raise ScramError("authentication failed") from None
            final: str = self._exchange.get_server_final()
        return final.encode()

    def _take_repeated_client_nonce(self, client_final: str) -> None:
        """The combined nonce scramp checks becomes the client's, when that only puts
        more in front of it (see ``nonce_suffix_ok``)."""
        sent = next((a[2:] for a in client_final.split(",") if a.startswith("r=")), "")
        combined = str(self._exchange.nonce)
        if sent != combined and sent.endswith(combined):
            self._exchange.nonce = Nonce(sent)


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
