"""The one home of what tests share, a module per kind: ``waits`` (bounded waits and
retries, waiting for a node's log line), ``cluster`` (the module-scoped cluster fixture and
helpers over real node processes), ``spark`` (the session fixture, the source, Spark jobs
as processes), ``wire`` (frames by hand), ``messages`` (raft messages and consumer
fetches, every field defaulted), ``forge`` (raft traffic as an attacker sends it), ``cli``
(the ``quorumlog`` command as a subprocess), ``spies`` (calls to a module's function
recorded as they are made), ``kafka`` (Kafka clients on a cluster's Kafka listener),
``config`` (a node's configuration, every field defaulted), ``scheduling`` (how pytest-xdist's
workers share the suite).
conftest.py files import the fixtures from here; no test imports from another test
module."""
