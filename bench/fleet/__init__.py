"""Whole fleets: routing under saturation, fleet scale, discovery, replicas, PD vs mixed, the sim."""
