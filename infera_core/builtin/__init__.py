"""Core's own plugin: registered through the ``infera`` entry point like any other.

It provides the small defaults that let ``infera-run`` work with only
``infera-core`` installed: the CLI subcommands, memory/static/etcd discovery, the
model/health/role filters, the round-robin / max-score pickers, the ``http`` request
transport and the ``zmq`` KV-event transport.
"""

from infera_core.builtin.commands import infera_register_commands
from infera_core.builtin.discovery import infera_register_discovery_backends
from infera_core.builtin.policies import infera_register_policies
from infera_core.builtin.tokenizers import infera_register_tokenizers
from infera_core.builtin.transports import (
    infera_register_kv_event_transports,
    infera_register_request_transports,
)

__all__ = [
    "infera_register_commands",
    "infera_register_discovery_backends",
    "infera_register_kv_event_transports",
    "infera_register_policies",
    "infera_register_request_transports",
    "infera_register_tokenizers",
]
