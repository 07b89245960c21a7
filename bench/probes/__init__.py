"""Measurements beyond the benchmark registry (``bench.registry``), each a module with a ``main()``
that does its work only when run, writing the file kept in the ledger under ledger/<machine>/:

- ``decode_parts``: the parts of one grouped decode step timed alone -> ``tq_decode_parts.json``;
- ``decode_floor_standalone``: streaming kernels with no arithmetic over the same cache ->
  ``tq_decode_floor_standalone.json``;
- ``decode_ncu_target``: the process ncu profiles for ``tq_decode_ncu.txt`` (command in its docstring);
- ``sm90_decode``: the sm_90 Gluon decode's configurations (and, optionally, an earlier version) beside
  the registry's bench, the gates of that run, errors at a small shape and the parts of its step ->
  ``tq_decode_sm90.json``, ``perf.json``, ``gates.json``;
- ``sm90_variants``: configurations of the sm_90 decode as conformance backends (loaded through
  ``KERNEL_LAB_BACKEND_MODULES``), and the float16 twins of cells;
- ``sm90_fp16_twins``: the float16 twins of the full tier's sm_90 cells in the runner's workers ->
  ``sm90_fp16_twins_cells.jsonl``;
- ``sm90_numerics``: the sm_90 decode's roundings emulated in NumPy and judged by the act-mma check -> printed;
- ``copy_ceiling``: device copies four ways (torch ``copy_`` and the Triton copy kernel, eager and
  captured) at the bench's sizes, or the copy kernel's configurations -> ``copy_ceiling.json``,
  ``copy_ceiling_variants.json``;
- ``sm90_ncu_target``: the process ncu profiles for ``tq_decode_sm90_ncu.txt`` (command in its docstring);
- ``operand_path_sm90``: bytes through shared memory per loop iteration, from sm_90 SASS compiled
  on any machine -> printed (``loop_shared_bytes`` is reusable);
- ``gdn_prefill``: the C++ GDN chunked prefill against vLLM's CPU kernel, fraction of the AMX tile
  peak, 1 -> 2 thread scaling -> ``gdn_cpu_prefill.json`` (``--out FILE``);
- ``decode_variants``: the grouped decode's configurations beside SDPA and the ceilings ->
  ``tq_decode_variants.json``;
- ``gdn_decode_configs``: the GPU GDN decode's tiles -> ``gdn_decode_gpu_configs.json``;
- ``gdn_decode_plans``: the C++ decode plans beside the in-place stream -> ``gdn_cpu_decode_plans.json``;
- ``gdn_decode_cached``: the C++ decode on L2-resident state (its arithmetic per item) beside the bench's
  streamed decode and the in-place stream -> ``gdn_decode_cached.json``;
- ``gdn_cpu_decode_builds``: builds of the C++ decode from several source trees, each in the registry's
  ``gdn/decode`` bench and in ``gdn_decode_cached``, side by side -> ``decode_builds.json`` and a table;
- ``gdn_prefill_builds``: builds of the C++ chunked prefill from several source trees, their outputs compared,
  each timed in ``gdn_prefill`` beside the tile peak of its run -> a table (both build through ``module_builds``);
- ``gdn_chunked_stages``: the GPU chunked prefill and each of its stages alone -> ``gdn_chunked_gpu.json``;
- ``gdn_chunked_kernels``: ncu's counters of each kernel of one GPU chunked prefill, ours and FLA's ->
  ``gdn_chunked_kernels.json`` and a table;
- ``gdn_chunked_variants``: its configurations, another version of the module and FLA side by side ->
  ``gdn_chunked_variants.json``;
- ``gdn_chunked_state``: its state pass against another version's, bit for bit, timed beside FLA, and ncu's
  counters of both -> ``gdn_chunked_state.json``, ``gdn_chunked_state_ncu.json``;
- ``executor_overhead``: the ray executor against the local pool -> ``executor_overhead.json``.

Run from the repository root, e.g. ``python -m bench.probes.decode_parts --out DIR``.
"""
