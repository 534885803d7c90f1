"""KV cache events, the router-side index, and the event hub."""
