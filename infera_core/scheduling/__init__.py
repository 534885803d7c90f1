"""Scheduling: filters → weighted scorers → one picker, assembled from config."""
