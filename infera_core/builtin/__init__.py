"""Core's own plugin: registered through the ``infera`` entry point like any other.

It provides the small defaults that let ``infera-run`` work with only
``infera-core`` installed: the CLI subcommands, memory/static/etcd discovery, the
model/health/role filters and the round-robin / max-score pickers.
"""

from infera_core.builtin.commands import infera_register_commands
from infera_core.builtin.discovery import infera_register_discovery_backends
from infera_core.builtin.policies import infera_register_policies
from infera_core.builtin.tokenizers import infera_register_tokenizers

__all__ = [
    "infera_register_commands",
    "infera_register_discovery_backends",
    "infera_register_policies",
    "infera_register_tokenizers",
]
