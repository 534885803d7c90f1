"""Example out-of-tree Infera plugin: the ``prefer-label`` scorer and ``example-labelled`` preset."""

__version__ = "0.1.0"
