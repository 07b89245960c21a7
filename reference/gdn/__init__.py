"""Gated delta rule (GDN) references: ``numpy_ref`` and ``jax_ref`` (same functions and arguments).

Conventions: q, k ``[T, H, K]``; v ``[T, HV, V]``; g, beta ``[T, HV]``;
value head ``hv`` uses key head ``hv // (HV // H)``; state pool ``[S, HV, K, V]`` (row = key dim)
in float32, bfloat16 or float16; slot index -1 is padding (nothing read or written).
"""
