"""The router's own cost per request: proxying, API keys, shared in-flight counts, hostile bodies."""
