"""The Kafka bus: producer wrapper, topic provisioning and offsets helpers over aiokafka.

* :class:`~memstream.infra.kafka.bus.Bus` — the producer (idempotent where the broker has it).
* :func:`~memstream.infra.kafka.admin.ensure_topics` — idempotent topic provisioning.
* :func:`~memstream.infra.kafka.admin.high_watermarks` — true end offsets of a topic.

``pom.xml`` beside this module names the Apache Kafka jars the embedded broker resolves.
"""

from memstream.infra.kafka.admin import (
    REPLAY_CONFIGS,
    ensure_topics,
    high_watermarks,
    topic_partitions,
)
from memstream.infra.kafka.bus import Bus

__all__ = ["REPLAY_CONFIGS", "Bus", "ensure_topics", "high_watermarks", "topic_partitions"]
