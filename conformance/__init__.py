"""kernel-lab conformance engine: the matrix, the backend registry, metrics, runner and CLI."""
