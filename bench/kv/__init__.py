"""The KV index: event ingestion, prefix scoring, routing decisions, KV events over NATS."""
