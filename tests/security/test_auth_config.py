"""The principals file's SCRAM credentials: one verifier (the original form, still read and
written as it was) or one per mechanism, and ``auth add-principal --mechanisms``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from quorumlog.replica.cli.main import main
from quorumlog.replica.node.security import AuthConfig, AuthConfigError, Principal
from quorumlog.replica.protocol.scram import SCRAM_SHA_256, SCRAM_SHA_512, make_verifier


def test_a_file_of_the_original_form_loads_and_saves_unchanged(tmp_path: Path) -> None:
    v = make_verifier("s")
    doc = {"principals": {"ingest": {"kind": "producer", "topics": ["a"], "scram": v.to_json()}}}
    auth = AuthConfig.from_json(doc)
    assert auth.credential("ingest") == (Principal("ingest", "producer", ("a",)), v)
    assert auth.credential("ingest", SCRAM_SHA_512) is None
    assert auth.to_json() == doc


def test_a_principal_may_hold_a_verifier_per_mechanism(tmp_path: Path) -> None:
    auth = AuthConfig()
    v256, v512 = make_verifier("s"), make_verifier("s", mechanism=SCRAM_SHA_512)
    auth.add(Principal("spark", "consumer", ("*",)), v256, v512)
    path = tmp_path / "auth.json"
    auth.save(path)
    scram = json.loads(path.read_text())["principals"]["spark"]["scram"]
    assert [v["mechanism"] for v in scram] == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    loaded = AuthConfig.load(path)
    assert loaded.credential("spark", SCRAM_SHA_256) == (
        Principal("spark", "consumer", ("*",)),
        v256,
    )
    assert loaded.credential("spark", SCRAM_SHA_512) == (
        Principal("spark", "consumer", ("*",)),
        v512,
    )
    only512 = {"principals": {"k": {"kind": "consumer", "scram": [v512.to_json()]}}}
    assert AuthConfig.from_json(only512).credential("k") is None  # no native login


@pytest.mark.parametrize(
    ("scram", "why"),
    [
        ([], "empty list"),
        ([make_verifier("a").to_json(), make_verifier("b").to_json()], "two scram verifiers"),
        (["x"], "must be an object"),
        ([{**make_verifier("a").to_json(), "mechanism": "SCRAM-SHA-1"}], "unsupported mechanism"),
    ],
)
def test_bad_credentials_are_refused_with_the_principal_named(scram: object, why: str) -> None:
    with pytest.raises(AuthConfigError, match=f"principal 'p'.*{why}"):
        AuthConfig.from_json({"principals": {"p": {"kind": "admin", "scram": scram}}})


def test_add_principal_stores_the_mechanisms_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "auth.json"
    monkeypatch.setenv("QL_SECRET", "s3cret")
    base = ["auth", "add-principal", "--config", str(path), "--secret-env", "QL_SECRET"]
    assert main([*base, "ops", "--kind", "admin"]) == 0
    assert main([*base, "spark", "--kind", "consumer", "--topics", "*",
                 "--mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512"]) == 0  # fmt: skip
    assert main([*base, "x", "--kind", "admin", "--mechanisms", "SCRAM-SHA-1"]) == 1
    doc = json.loads(path.read_text())["principals"]
    assert doc["ops"]["scram"]["mechanism"] == "SCRAM-SHA-256"  # the original form
    assert "x" not in doc
    auth = AuthConfig.load(path)
    for mechanism in (SCRAM_SHA_256, SCRAM_SHA_512):
        entry = auth.credential("spark", mechanism)
        assert entry is not None and entry[1].mechanism is mechanism
    assert auth.credential("ops", SCRAM_SHA_512) is None
