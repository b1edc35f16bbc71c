"""Plain-Python reward functions on model text, safe on untrusted output."""
