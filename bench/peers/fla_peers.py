"""FLA's GDN decode in the benchmark registry (fla-core 0.6.0): ``fla`` on gdn/decode-gpu,
``fused_recurrent_gated_delta_rule`` on one token per sequence with its gating in the kernel
(``use_gate_in_kernel`` with A_log and dt_bias, ``use_beta_sigmoid_in_kernel``), the pool as
``initial_state`` (slot n for sequence n: FLA takes no slot table) and ``output_final_state=True``,
which FLA returns as a new float32 ``[N, HV, K, V]`` tensor whatever the pool's dtype; ``fla`` and ``fla-eager`` on
gdn/chunked-gpu, ``chunk_gated_delta_rule`` as CUDA-graph replays and launched eagerly. Not on gdn/spec-decode-gpu:
FLA 0.6's recurrent kernel stores a sequence's last state only, not one per draft token."""
from bench.machine import gpu_capability
from bench.registry import Impl, register_impl


def _available() -> tuple[bool, str]:
    ok, why = gpu_capability()
    if not ok:
        return ok, why
    from conformance.backends.fla_gdn import fla_version

    version = fla_version()
    return (True, f"fla-core {version}") if version else (False, "fla-core is not installed")


def _decode(shape, inputs):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    x = inputs
    q, k, v, a, b = (x[n][None] for n in ("q", "k", "v", "a", "b"))
    return lambda: fused_recurrent_gated_delta_rule(q, k, v, g=a, beta=b, initial_state=x["state"],
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True,
                                                    use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
                                                    use_beta_sigmoid_in_kernel=True)


register_impl(Impl(bench="gdn/decode-gpu", name="fla", role="peer", prepare=_decode, available=_available))


def dense(x, shape: dict):
    """A packed ``[T, ...]`` tensor of equal-length sequences as FLA's batch ``[N, T / N, ...]`` (a view)."""
    n = len(shape["lens"])
    return x.view(n, x.shape[0] // n, *x.shape[1:])


def _chunked(shape, inputs):
    """FLA's chunk form on gdn/chunked-gpu: equal-length sequences as a batch (no ``cu_seqlens``, which FLA
    would copy to the host each call), the pool as ``initial_state`` in its dtype (sequence n from slot n:
    FLA takes no slot table), ``output_final_state=True`` (a new float32 tensor)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    x = {n: dense(inputs[n], shape) for n in ("q", "k", "v", "g", "beta")}
    return lambda: chunk_gated_delta_rule(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"],
                                          initial_state=inputs["state"], output_final_state=True,
                                          use_qk_l2norm_in_kernel=True)


register_impl(Impl(bench="gdn/chunked-gpu", name="fla", role="peer", prepare=_chunked, available=_available))
# the same call launched eagerly (FLA's host work between its kernels included): what a caller without graphs sees
register_impl(Impl(bench="gdn/chunked-gpu", name="fla-eager", role="peer", prepare=_chunked, available=_available,
                   timing="events"))
