"""Infera engine plugin for ATOM: launch (etcd discovery), Mooncake PD on /v1/completions."""

__version__ = "0.1.0"
