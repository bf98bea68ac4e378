"""The Kafka bus: producer wrapper, topic provisioning and offsets helpers over aiokafka."""
