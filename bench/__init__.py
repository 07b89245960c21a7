"""Benchmarks of the family ops, in the style of tritonbench's operators.

- ``registry``: per family op a ``Bench`` (shapes, cost model, inputs) and its implementations
  side by side (``Impl``: ours, torch baselines, peers, ceilings), each with a capability check
  that says why it is disabled; ``register_impl`` is the hook peers use.
- the cost models (bytes moved, FLOPs at a shape) live beside each op, in
  ``conformance/families/<family>/cost.py``.
- ``gdn_cpu``, ``turboquant_gpu``: the benches, their implementations and ceilings.
- ``timing``, ``measure``: interleaved CPU timing and CUDA-graph GPU timing into records whose
  ``extra_info`` is the perf-JSON schema.
- ``gates``: gates as data (bench/gates.toml) and verdicts; ``baselines``: saved runs per
  machine fingerprint, regression gates, A/A noise and the pairs of an unfinished A/A; ``run``: a
  whole run and its JSON; ``cli``: ``kernel-lab bench`` / ``python -m bench``.
"""
