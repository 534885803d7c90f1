"""Tokenization for routing: turn a request into the token ids the engine will see."""
