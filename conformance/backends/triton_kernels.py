"""The Triton TurboQuant kernels (``optimized/triton``) as backends of the turboquant family.

Five decode kernels, each held to the matrix on a GPU and (all but the sm_90 decode) through the interpreter
(``TRITON_INTERPRET=1``, fp32 everywhere), on the CPU:

- ``triton`` / ``triton-interpret``: store kernel + split-KV decode (AoS and SoA, every preset);
  fp32 elementwise math, rounding model ``exact``.
- ``triton-grouped`` / ``triton-grouped-interpret``: store kernel + grouped-query decode (SoA,
  ``turboquant_4bit_nc`` only; keys through the 16-entry centroid table); MMA operands in the
  activation dtype on the GPU (``act-mma``: bf16, fp16, or fp32 for float32 activations), fp32 in the
  interpreter.
- ``triton-lut`` / ``triton-lut-interpret``: the same decode with the pair lookup table (one lookup
  per key byte yields both dequantized codes: the FLUTE idea).
- ``triton-unified`` / ``triton-unified-interpret``: store kernel + unified attention run as a
  decode (one query token per sequence; SoA, every preset); ``act-mma`` on the GPU, ``exact`` in
  the interpreter.
- ``triton-sm90``: store kernel + the Gluon decode for sm_90 (``tq_decode_sm90``: operands built in
  registers; SoA ``turboquant_4bit_nc``), ``act-mma-table`` for bfloat16 and float16 activations (rotated
  queries and the centroid table in that dtype, the norm on the fp32 score, exact value codes times ``P * s``
  in that dtype; float32 cells are skips with the reason: its ``mma.sync`` takes 16-bit operands); available
  only on an NVIDIA GPU of compute capability 9.0 (Gluon has no interpreter, so no ``-interpret`` twin).
Query, key and value reach the kernels in the cell's activation dtype; the decode output is written
into a poisoned buffer (an element never written is NaN) of that dtype on a GPU, and of float32 in the
interpreter, whose fp32 -> bf16 conversion truncates instead of rounding to nearest even
(``INTERPRETER_BF16``).
"""
from __future__ import annotations

from conformance import families, fingerprint, paths
from conformance.cells import activation
from conformance.registry import INTERPRET_ENV, Backend, register
from conformance.torch_arrays import to_numpy, to_torch

# The interpreter runs every program instance in Python. On 2 CPU cores (2026-12-01) a store cell
# took about 1.5e-4 s per unit of tokens*heads*dims (10 s for 64 tokens x 8 heads x 128), a decode
# cell 3e-6 to 1.4e-5 s per unit (6 s for 2M), plus 2 s of tracing and compiling; the runner rescales
# these per op from the records as a run goes. The budgets admit every ci-tier cell.
INTERPRET_COST = {"seconds_per_cell": 2.0, "seconds_per_work": 1e-5,
                  "work_budget": {"store": 65_536, "decode": 2_097_152, "store_decode": 2_097_152}}
# Triton 3.8's interpreter, 2026-12-01: a store of fp32 values through a bf16 pointer (or .to(tl.bfloat16))
# differed from torch's round-to-nearest-even in 500 of 1024 N(0, 1) values, relative error up to 2^-7.1
# (truncation); fp16 conversions round correctly (NumPy's float16)
INTERPRETER_BF16 = "the Triton interpreter converts fp32 to bf16 by truncation, not round to nearest even"


# kernel -> (launcher in optimized.launchers.LAUNCHERS, its extra options, whether it takes ``precision``)
KERNELS = {"split": ("triton-split", {}, False), "grouped": ("triton-grouped", {"keys": "gather"}, True),
           "lut": ("triton-grouped", {"keys": "pair"}, True), "unified": ("triton-unified", {}, True),
           "sm90": ("triton-sm90", {}, False)}


class TritonImpl:
    """The reference's ``store``/``decode`` signatures (NumPy in, NumPy out) over the launchers.

    kernel: a key of ``KERNELS``; device: "cpu" (the interpreter) or "cuda"; precision: "exact" (fp32) or
    "act" (MMA operands in the query's dtype); options: more keyword arguments of the decode launcher (a
    configuration: stages, block_n, ...)."""

    def __init__(self, kernel: str, device: str, precision: str, options: dict | None = None):
        self.kernel, self.device, self.precision = kernel, device, precision
        self.launcher, extra, takes_precision = KERNELS[kernel]
        self.options = {**extra, **({"precision": precision} if takes_precision else {}), **(options or {})}

    def _t(self, x):
        return to_torch(x, self.device)

    def store(self, kv_cache, key, value, slot_mapping, preset, layout, rotation):
        from optimized import launchers

        cache = self._t(kv_cache)
        launchers.entry("triton-store", "store")(cache, self._t(key), self._t(value), self._t(slot_mapping), preset=preset, layout=layout,
              rotation=self._t(rotation))
        return to_numpy(cache)

    def decode(self, query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        import torch

        from conformance.poison import poisoned
        from optimized import launchers

        q, cache, bt, lens = self._t(query), self._t(kv_cache), self._t(block_table), self._t(seq_lens)
        kw = dict(preset=preset, layout=layout, rotation=self._t(rotation), scale=scale, sinks=self._t(sinks),
                  out=self._t(poisoned(query.shape, "float32" if self.device == "cpu" else query.dtype)), **self.options)
        if self.kernel == "unified":   # unified attention run as a decode: one query token per sequence
            qsl = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=self.device)
            out = launchers.entry(self.launcher, "unified_attention")(q, cache, bt, qsl, lens, 1, **kw)
        else:
            out = launchers.entry(self.launcher, "decode")(q, cache, bt, lens, **kw)
        return to_numpy(out)


def _gpu_available() -> tuple[bool, str]:
    try:
        import triton
    except ImportError as exc:
        return False, f"triton is not importable ({exc})"
    ok, where = fingerprint.triton_gpu()
    if not ok:
        return False, f"{where}: Triton compiles only for GPUs, so here it runs only through its interpreter (the *-interpret backends)"
    return True, f"triton {triton.__version__} on {where}"


def _sm90_available() -> tuple[bool, str]:
    ok, why = _gpu_available()
    if not ok:
        return ok, why
    import torch

    from optimized.triton.tq_decode_sm90 import device_problem

    problem = device_problem(torch.device("cuda"))
    return (False, problem) if problem else (True, why + " (sm_90)")


def _interpret_available() -> tuple[bool, str]:
    try:
        import torch  # noqa: F401
        import triton
    except ImportError as exc:
        return False, f"torch/triton not importable ({exc})"
    from conformance.triton_interpreter import runtime_loop_problem

    problem = runtime_loop_problem()
    if problem:
        return False, problem
    return True, (f"triton {triton.__version__} interpreter on the CPU (TRITON_INTERPRET=1: every program "
                  "instance runs in Python, ~1 ms each; bf16 arithmetic upcast to fp32 after loads)")


def _supports(kernel: str):
    def supports(cell) -> str | None:
        from optimized import launchers

        launcher = "triton-store" if cell.op == "store" else KERNELS[kernel][0]
        return launchers.module(launcher).problem(
            preset=cell["preset"], layout=cell["layout"], D=cell["D"], block_size=cell["bs"], G=cell.get("G"),
            sinks=bool(cell.get("sinks")), act=activation(cell))

    return supports


def _make(name: str, kernel: str, interpret: bool, ops: tuple[str, ...]) -> Backend:
    precision = "exact" if interpret or kernel == "split" else "act"

    def run(cell, inputs):
        impl = TritonImpl(kernel, "cpu" if interpret else "cuda", precision)
        return families.get(cell.family).run_with(impl, cell, inputs)

    available = _interpret_available if interpret else _sm90_available if kernel == "sm90" else _gpu_available
    path = paths.fixed("interpreter") if interpret else paths.fixed("sm_90") if kernel == "sm90" else paths.on_gpu
    return register(Backend(
        name=name, ops={"turboquant": ops}, available=available, run=run, supports=_supports(kernel),
        rounding_models={"turboquant": "exact" if precision == "exact" else "act-mma-table" if kernel == "sm90"
                         else "act-mma"},
        env=INTERPRET_ENV if interpret else {}, timeout_s=1800.0 if interpret else 600.0, uses_gpu=not interpret,
        probe_call=interpret, path=path, **(INTERPRET_COST if interpret else {})))


_ALL = ("store", "decode", "store_decode")
_DEC = ("decode", "store_decode")
for _interp in (False, True):
    _sfx = "-interpret" if _interp else ""
    _make("triton" + _sfx, "split", _interp, _ALL)
    _make("triton-grouped" + _sfx, "grouped", _interp, _DEC)
    _make("triton-lut" + _sfx, "lut", _interp, _DEC)
    _make("triton-unified" + _sfx, "unified", _interp, _DEC)
_make("triton-sm90", "sm90", False, _DEC)
