"""Plain-torch baselines: what a user runs without custom kernels (the speed anchors)."""
