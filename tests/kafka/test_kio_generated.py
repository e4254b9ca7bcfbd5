"""``replica/kafka/kio_messages.py`` is what the generator writes from the installed kio:
nobody edited it by hand, and a new kio release or a change to the generator's list is
regenerated (``python -m tests.kafka.kio_generate``) before it lands."""

from __future__ import annotations

from quorumlog.replica.kafka import messages

from .kio_generate import GENERATED, TARGET, kio_api, render


def test_the_generated_module_is_current() -> None:
    assert TARGET.read_text() == render(), "run: python -m tests.kafka.kio_generate"


def test_every_generated_api_is_served_as_kio_defines_it() -> None:
    """The listener serves the generated schemas (not a copy), with kio's fields and
    version ranges at every version served."""
    for const, name, low, high in GENERATED:
        served = getattr(messages, const)
        assert served in messages.ALL_APIS
        derived = kio_api(name, low, high)
        for version in range(low, high + 1):
            for request in (True, False):
                assert served.plan(version, request) == derived.plan(version, request), (
                    name,
                    version,
                    request,
                )


def test_a_field_kio_renamed_by_its_unit_gets_kafka_s_name_back() -> None:
    """kio holds ``throttle_time_ms`` as ``throttle_time`` (a timedelta): the schema
    keeps Kafka's name, which the handlers use."""
    api = kio_api("ListGroups", 0, 5)
    assert [f.name for f in api.response][0] == "throttle_time_ms"
    assert api.response[0].versions == "1-5"
