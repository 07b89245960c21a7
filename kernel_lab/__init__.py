"""The ``kernel-lab`` command (also ``python -m kernel_lab``): the top layer, above every package
it dispatches to (conformance, reports, bench, planner, optimized.flydsl)."""
