"""The truth: slow, obviously-right NumPy and JAX references, one subpackage per kernel family."""
