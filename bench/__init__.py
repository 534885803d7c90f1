"""Infera's benchmarks, run as modules from the repository root (see ``bench/README.md``)."""
