"""The C++ GDN kernels (``optimized.cpu``) as three backends, one per code path:
``cpu-amx``, ``cpu-avx512`` and ``cpu-scalar``.

Each wraps the kernels in the reference's function names and NumPy semantics and lets the gdn
family's ``run_with`` drive the cell (two-call splits included); every activation dtype runs (the
kernels load bf16, fp16 and fp32 and write o in the activations' dtype). ``recurrent`` (any write
interval) is not implemented: those cells are skips. Rounding model (gdn) ``bf16-operands``: the chunk
kernel rounds its GEMM operands to bf16 exactly as ``numpy_ref.chunked(operand_dtype="bfloat16")``;
the family holds decode and spec decode to the exact oracle whatever the model (they compute in
fp32 and round only the state).

Path: the ISA build the extension dispatched the cell's calls to (``optimized.cpu.dispatch_counts``),
``scalar`` for gating (one portable build, whichever backend calls it); a skip's is the backend's ISA.
"""
from __future__ import annotations

from conformance import paths
from conformance.registry import Backend, register

OPS = {"gdn": ("gating", "chunked", "decode", "spec_decode")}


class KernelImpl:
    """The reference's function names over one ISA of ``optimized.cpu``: activations go in as they come
    (bf16, fp16 or fp32) and o comes back in their dtype, as the kernels return it by default."""

    def __init__(self, isa: str):
        import optimized.cpu as cpu

        self._cpu = cpu
        self.isa = isa

    @staticmethod
    def _check_state(state, state_dtype: str) -> None:
        if state.dtype.name != state_dtype:
            raise TypeError(f"state: expected dtype {state_dtype} (state_dtype), got {state.dtype.name}")

    def gating(self, A_log, a, b, dt_bias):
        return self._cpu.gdn_gating(A_log, a, b, dt_bias)

    def decode(self, q, k, v, A_log, a, b, dt_bias, state, state_indices, *, state_dtype, **kw):
        self._check_state(state, state_dtype)
        return self._cpu.gdn_decode(q, k, v, A_log, a, b, dt_bias, state, state_indices, **kw,
                                    isa=self.isa)

    def spec_decode(self, q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens,
                    cu_seqlens, *, state_dtype, **kw):
        self._check_state(state, state_dtype)
        return self._cpu.gdn_spec_decode(q, k, v, A_log, a, b, dt_bias, state, spec_state_indices,
                                         num_accepted_tokens, cu_seqlens, **kw, isa=self.isa)

    def chunked(self, q, k, v, g, beta, cu_seqlens, state, state_indices, *, state_dtype, chunk_size=64,
                **kw):
        self._check_state(state, state_dtype)
        if chunk_size != 64:
            raise ValueError(f"chunk_size: the C++ chunk kernel uses 64, got {chunk_size}")
        return self._cpu.gdn_chunk_prefill(q, k, v, g, beta, cu_seqlens, state, state_indices, **kw,
                                           isa=self.isa)


def _supports(cell) -> str | None:
    import optimized.cpu as cpu

    K, V = cell.get("K"), cell.get("V", cell.get("K"))
    return cpu.problem({"chunked": "chunk_prefill"}.get(cell.op, cell.op), K, V)


def _make(isa: str) -> Backend:
    def available() -> tuple[bool, str]:
        import optimized.cpu as cpu

        built, why = cpu.extension_status()
        if not built:
            return False, why
        return cpu.isa_status()[isa]

    def run(cell, inputs):
        import optimized.cpu as cpu
        from conformance import families

        before = cpu.dispatch_counts()
        outputs = families.get(cell.family).run_with(KernelImpl(isa), cell, inputs)
        after = cpu.dispatch_counts()
        paths.took("+".join(name for name in cpu.ISAS if after[name] > before[name]) or "none dispatched")
        return outputs

    return register(Backend(name=f"cpu-{isa}", ops=OPS, available=available, run=run, supports=_supports,
                            rounding_models={"gdn": "bf16-operands"},
                            path=lambda cell: "scalar" if cell.op == "gating" else isa))


CPU_AMX = _make("amx")
CPU_AVX512 = _make("avx512")
CPU_SCALAR = _make("scalar")
