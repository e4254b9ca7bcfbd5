"""Kafka wire protocol for quorumlog's optional Kafka listener: a sans-I/O codec.

``wire`` (primitives, frames), ``schema`` + ``messages`` (the APIs and versions served),
``codec`` (request/response headers), ``records`` (RecordBatch v2 with CRC32C) and
``convert`` (Kafka batches <-> quorumlog's Arrow batches). No sockets here.
"""
