"""Infera routing policies: kv-overlap, load, least-load, approximate-prefix, session affinity, power-of-two, random."""

__version__ = "0.1.0"
