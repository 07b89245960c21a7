"""Measurements beyond the benchmark registry (``bench.registry``), each a module with a ``main()``
that does its work only when run, writing the file committed under reports/baselines/<machine>/:

- ``decode_parts``: the parts of one grouped decode step timed alone -> ``tq_decode_parts.json``;
- ``decode_floor_standalone``: streaming kernels with no arithmetic over the same cache ->
  ``tq_decode_floor_standalone.json``;
- ``decode_ncu_target``: the process ncu profiles for ``tq_decode_ncu.txt`` (command in its docstring);
- ``sm90_decode``: the sm_90 Gluon decode's configurations beside the registry's bench, its errors
  at small shapes and the parts of its step -> ``tq_decode_sm90.json``;
- ``sm90_ncu_target``: the process ncu profiles for ``tq_decode_sm90_ncu.txt`` (command in its docstring);
- ``operand_path_sm90``: bytes through shared memory per loop iteration, from sm_90 SASS compiled
  on any machine -> printed (``loop_shared_bytes`` is reusable);
- ``gdn_prefill``: the C++ GDN chunked prefill against vLLM's CPU kernel, fraction of the AMX tile
  peak, 1 -> 2 thread scaling -> ``gdn_prefill_bench_*.json``.

Run from the repository root, e.g. ``python -m bench.probes.decode_parts --out DIR``.
"""
