"""Infera on Kubernetes: the ``kubernetes`` discovery backend (worker pods by label)."""
