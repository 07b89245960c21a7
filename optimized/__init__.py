"""Optimized implementations, one subpackage per technology: cpu (C++), triton, flydsl, torch."""
