"""SCRAM-SHA-256 and SCRAM-SHA-512 exchanges (protocol/scram.py, on scramp): the
published RFC 7677 exchange, the RFC 5802 formulas computed independently for SHA-512,
that a verifier checks exchanges of its own hash only, and librdkafka 2.0's repeated
client nonce where Kafka takes it."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from quorumlog.replica.protocol import scram
from quorumlog.replica.protocol.scram import (
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    ScramClient,
    ScramError,
    ScramServerSession,
    Verifier,
    decoy_verifier,
    make_verifier,
)

# RFC 7677 section 3.
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _exchange(client: ScramClient, verifier: Verifier) -> tuple[ScramServerSession, bytes]:
    session = ScramServerSession(client.first_message(), lambda _: verifier, client.mechanism)
    return session, client.final_message(session.first_message())


def test_the_rfc_7677_exchange_both_sides() -> None:
    client = ScramClient("user", "pencil", RFC_CLIENT_NONCE)
    first = client.first_message()
    assert first == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    verifier = make_verifier("pencil", salt=RFC_SALT)
    session = ScramServerSession(first, lambda _: verifier, server_nonce=RFC_SERVER_NONCE)
    assert session.principal == "user"
    server_first = session.first_message()
    assert server_first == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert client.final_message(server_first) == RFC_CLIENT_FINAL
    assert session.verify_client_final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    client.verify_server_final(RFC_SERVER_FINAL)


def _independent_sha512(
    password: str, salt: bytes, iterations: int, auth_message: bytes
) -> tuple[bytes, bytes]:
    """RFC 5802 section 3 with SHA-512, from hashlib alone: (ClientProof, ServerSignature)."""
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha512").digest()
    stored_key = hashlib.sha512(client_key).digest()
    signature = hmac.new(stored_key, auth_message, "sha512").digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_key = hmac.new(salted, b"Server Key", "sha512").digest()
    return proof, hmac.new(server_key, auth_message, "sha512").digest()


def test_a_sha512_exchange_follows_rfc_5802_with_sha512() -> None:
    verifier = make_verifier("pencil", salt=b"0123456789abcdef", mechanism=SCRAM_SHA_512)
    assert verifier.mechanism is SCRAM_SHA_512 and len(verifier.stored_key) == 64
    client = ScramClient("user", "pencil", "cnonce", mechanism=SCRAM_SHA_512)
    session = ScramServerSession(client.first_message(), lambda _: verifier, SCRAM_SHA_512)
    server_first = session.first_message().decode()
    client_final = client.final_message(server_first.encode())
    without_proof, _, proof = client_final.decode().rpartition(",p=")
    auth_message = f"n=user,r=cnonce,{server_first},{without_proof}".encode()
    expected_proof, expected_signature = _independent_sha512(
        "pencil", b"0123456789abcdef", 4096, auth_message
    )
    assert base64.b64decode(proof) == expected_proof
    server_final = session.verify_client_final(client_final)
    assert server_final == b"v=" + base64.b64encode(expected_signature)
    client.verify_server_final(server_final)


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512])
def test_a_wrong_secret_or_an_unknown_principal_fails_alike(mechanism: scram.Mechanism) -> None:
    verifier = make_verifier("right", mechanism=mechanism)
    session, final = _exchange(ScramClient("u", "wrong", mechanism=mechanism), verifier)
    with pytest.raises(ScramError, match="authentication failed"):
        session.verify_client_final(final)
    decoy = decoy_verifier("nobody", b"k" * 32, mechanism)
    assert decoy == decoy_verifier("nobody", b"k" * 32, mechanism)  # same salt every time
    assert len(decoy.stored_key) == len(verifier.stored_key)
    session, final = _exchange(ScramClient("nobody", "x", mechanism=mechanism), decoy)
    with pytest.raises(ScramError, match="authentication failed"):
        session.verify_client_final(final)


def test_the_native_decoy_is_unchanged() -> None:
    key = b"k" * 32
    decoy = decoy_verifier("nobody", key)
    assert decoy.salt == hmac.new(key, b"salt:nobody", "sha256").digest()[:16]
    assert decoy.stored_key == hmac.new(key, b"sk:nobody", "sha256").digest()
    assert decoy_verifier("nobody", key, SCRAM_SHA_512).salt != decoy.salt


@pytest.mark.parametrize(
    ("verifier_mechanism", "client_mechanism"),
    [(SCRAM_SHA_256, SCRAM_SHA_512), (SCRAM_SHA_512, SCRAM_SHA_256)],
)
def test_a_verifier_checks_its_own_hash_only(
    verifier_mechanism: scram.Mechanism, client_mechanism: scram.Mechanism
) -> None:
    verifier = make_verifier("s", mechanism=verifier_mechanism)
    session, final = _exchange(ScramClient("u", "s", mechanism=client_mechanism), verifier)
    with pytest.raises(ScramError, match="authentication failed"):
        session.verify_client_final(final)


def test_verifiers_round_trip_json_with_their_mechanism() -> None:
    for mechanism in (SCRAM_SHA_256, SCRAM_SHA_512):
        v = make_verifier("s", mechanism=mechanism)
        doc = v.to_json()
        assert doc["mechanism"] == mechanism.name
        assert Verifier.from_json(doc) == v
    legacy = make_verifier("s").to_json()
    del legacy["mechanism"]  # files from before mechanisms were named
    assert Verifier.from_json(legacy).mechanism is SCRAM_SHA_256
    with pytest.raises(ScramError, match="unsupported mechanism"):
        Verifier.from_json({**legacy, "mechanism": "SCRAM-SHA-1"})
    short = {**make_verifier("s", mechanism=SCRAM_SHA_512).to_json(), "mechanism": "SCRAM-SHA-256"}
    with pytest.raises(ScramError, match="32 bytes"):
        Verifier.from_json(short)


def _librdkafka_2_0_final(secret: str, client_nonce: str, server_first: bytes) -> bytes:
    """The client-final message librdkafka 2.0 sends: its client nonce in front of the
    combined nonce, and a proof over that."""
    m = SCRAM_SHA_512
    attrs = dict(part.split("=", 1) for part in server_first.decode().split(","))
    salted = hashlib.pbkdf2_hmac(
        m.hash_name, secret.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
    )
    client_key = m.hmac(salted, b"Client Key")
    without_proof = f"c=biws,r={client_nonce}{attrs['r']}"
    auth_message = f"n=u,r={client_nonce},{server_first.decode()},{without_proof}".encode()
    signature = m.hmac(m.h(client_key), auth_message)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def test_a_repeated_client_nonce_is_taken_only_where_kafka_takes_it() -> None:
    verifier = make_verifier("pw", mechanism=SCRAM_SHA_512)

    def start(lenient: bool) -> ScramServerSession:
        return ScramServerSession(
            b"n,,n=u,r=cn", lambda _: verifier, SCRAM_SHA_512, nonce_suffix_ok=lenient
        )

    for lenient in (False, True):
        session = start(lenient)
        final = _librdkafka_2_0_final("pw", "cn", session.first_message())
        if lenient:
            assert session.verify_client_final(final).startswith(b"v=")
        else:
            with pytest.raises(ScramError, match="nonce mismatch"):
                session.verify_client_final(final)
    # Lenient or not, the nonce must end with this exchange's server nonce.
    session = start(True)
    session.first_message()
    stale = _librdkafka_2_0_final("pw", "cn", b"r=cnOLD,s=c2FsdA==,i=4096")
    with pytest.raises(ScramError, match="nonce mismatch"):
        session.verify_client_final(stale)


def test_a_malformed_or_channel_bound_client_first_is_refused() -> None:
    verifier = make_verifier("pw")
    for message in (b"y,,n=u,r=cn", b"n,,r=cn", b"n,,n=u", b"\xff\xfe"):
        with pytest.raises(ScramError):
            ScramServerSession(message, lambda _: verifier)


def test_a_replayed_client_final_fails_against_a_fresh_server_nonce() -> None:
    verifier = make_verifier("pw")
    client = ScramClient("u", "pw", "cn")
    first = client.first_message()
    session = ScramServerSession(first, lambda _: verifier)
    final = client.final_message(session.first_message())
    assert session.verify_client_final(final).startswith(b"v=")
    again = ScramServerSession(first, lambda _: verifier)
    again.first_message()
    with pytest.raises(ScramError, match="nonce mismatch"):
        again.verify_client_final(final)


def test_a_client_refuses_a_server_that_does_not_hold_its_verifier() -> None:
    client = ScramClient("u", "pw")
    session = ScramServerSession(client.first_message(), lambda _: make_verifier("other"))
    client.final_message(session.first_message())
    with pytest.raises(ScramError):
        client.verify_server_final(b"v=" + base64.b64encode(b"x" * 32))
    other = ScramClient("u", "pw", "cn")
    other.first_message()
    with pytest.raises(ScramError, match="nonce"):  # not an extension of our nonce
        other.final_message(b"r=elsewhere,s=c2FsdHNhbHRzYWx0,i=4096")
