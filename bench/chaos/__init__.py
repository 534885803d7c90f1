"""Chaos: bad inputs and faulty workers thrown at a real stack (``python -m bench.chaos.run``)."""
