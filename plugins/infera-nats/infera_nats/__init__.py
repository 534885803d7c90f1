"""Infera's NATS plane: discovery, request transport and KV-event transport over NATS."""
