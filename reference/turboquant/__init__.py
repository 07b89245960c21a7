"""TurboQuant KV-cache references: ``numpy_ref`` and ``jax_ref`` (same functions, same arguments)."""
