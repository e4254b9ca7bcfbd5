"""The Kafka listener (``serve --kafka-listen``): Kafka clients' requests mapped onto a
node's native api layer. ``server`` accepts connections, ``handlers`` answers the
partition and cluster APIs, ``groups`` and ``group_admin`` are the group coordinator,
``topic_admin`` and ``configs`` the admin APIs, ``auth`` SASL and authorization,
``errors`` the native-to-Kafka error mapping."""
