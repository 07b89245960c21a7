"""FLA's gated delta rule (``fla-core`` 0.6.0) as peers of the gdn family.

- ``fla``: ``chunk_gated_delta_rule`` (the chunked op) and ``fused_recurrent_gated_delta_rule``
  (the recurrent op) from ``fla.ops.gated_delta_rule``, in Triton on a GPU, on the cell's activations
  in their own dtype (g in float32): varlen through ``cu_seqlens``, GVA (HV > H), q/k l2 norm in the
  kernel (``use_qk_l2norm_in_kernel``), state ``[N, HV, K, V]`` gathered from and scattered back to the
  pool by the adapter; o comes back in the activation dtype. Rounding model ``fla-chunk``: its chunked
  op is held to an oracle that rounds to the activation dtype where FLA's chunk kernels do (bf16 and
  fp16; fp32 activations are skips: FLA's fp32 path runs every dot at TF32, the model only T's merge);
  its recurrent op (fp32 arithmetic inside) is held to exact, as that model prescribes for every other op.
- ``fla-naive``: FLA's torch references ``naive_chunk_gated_delta_rule`` and
  ``naive_recurrent_gated_delta_rule`` on the CPU in float32 (the activations converted exactly), one
  sequence at a time; they take
  neither GVA nor the l2 norm, so the adapter repeats each key head over its value heads and
  normalises q and k (float32, x / sqrt(sum x^2 + eps)) before the call; ``exact``.

FLA's l2 norm epsilon is 1e-6, as ours (``fla/modules/norm/l2norm.py``, ``l2norm_fwd``). Both keep
the state in float32 inside a call; the adapter stores it into the pool's dtype (round to nearest)
after each call.

FLA's chunk form (fla-core 0.6.0, https://github.com/fla-org/flash-linear-attention/blob/v0.6.0/fla,
line numbers of the wheel's files) rounds to bf16 where the ``fla-chunk`` oracle
(``numpy_ref.chunked(rounding_points="fla")``) does: o is stored in the input dtype
(ops/common/chunk_o.py#L565, store at #L155); q and k leave the l2 norm in bf16
(ops/gated_delta_rule/chunk.py#L283) and q's scale and exp(g) multiply the fp32 dot products
(ops/common/chunk_o.py#L138-L154); the state increment is k^T bf16(v_new exp(g_last - g)) from the
unrounded v_new (ops/common/chunk_delta_h.py#L250, #L288); the chunk-start state h (#L185, #L214),
A = (I + M)^-1 (ops/gated_delta_rule/chunk_fwd.py#L385), w and u (ops/gated_delta_rule/wy_fast.py#L88-L106).
Its A is merged from 16-row diagonal blocks by dots whose operands the tensor cores truncate to TF32
(chunk_fwd.py#L21, #L257-L291); the oracle merges the same blocks in the same order with the same truncation.
Against the ``bf16-operands`` oracle those placements failed 27 of the 42 chunked cells of the H200 run
of 2026-12-01 (o rel_l2 0.0016-0.0045); the oracle's emulation of them reproduced every verdict
(``kernel-lab study fla-chunk-rounding``).
"""
from __future__ import annotations

import numpy as np

from conformance import fingerprint, paths
from conformance.cells import activation
from conformance.families.gdn.models import defined_for
from conformance.registry import Backend, register
from conformance.torch_arrays import to_numpy, to_torch, torch_dtype


def fla_version() -> str | None:
    try:
        import importlib.metadata as md

        return md.version("fla-core")
    except Exception:
        return None


def _available(gpu: bool):
    def probe() -> tuple[bool, str]:
        version = fla_version()
        if version is None:
            return False, "fla-core is not installed (`make peers` installs fla-core==0.6.0)"
        try:
            import torch  # noqa: F401 (importable, not only installed)
        except ImportError as exc:
            return False, f"torch is not importable ({exc})"
        if gpu:
            ok, where = fingerprint.triton_gpu()
            if not ok:
                return False, f"{where} (FLA's GDN kernels are Triton for GPUs; fla-naive runs its torch reference on the CPU)"
            return True, f"fla-core {version} Triton kernels on {where}"
        return True, f"fla-core {version} naive torch references (fla.ops.gated_delta_rule.naive), float32 on the CPU"

    return probe


def _l2norm(x, eps: float):
    return x / (x * x).sum(-1, keepdim=True).add(eps).sqrt()


class FlaImpl:
    """The reference's ``recurrent`` and ``chunked`` over FLA (functional form: (o, new_pool)); the
    recurrent op's write interval is the whole call (see ``_supports``)."""

    def __init__(self, gpu: bool):
        self.gpu = gpu
        self.device = "cuda" if gpu else "cpu"

    def _run(self, q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale, use_qk_l2norm, l2norm_eps,
             state_dtype, chunked: bool):
        import torch

        dev, f32 = self.device, torch.float32
        act = torch_dtype(np.asarray(q).dtype.name)
        pool = np.array(state)
        idx = np.asarray(state_indices)
        cu = np.asarray(cu_seqlens).astype(np.int64)
        real = np.flatnonzero(idx >= 0)
        T, H, K = q.shape
        HV = v.shape[1]
        o = np.zeros(v.shape, q.dtype if self.gpu else np.float32)
        if len(real) == 0:
            return o, pool
        tokens = np.concatenate([np.arange(cu[n], cu[n + 1]) for n in real])
        dt = act if self.gpu else f32           # the naive references compute in float32
        qt, kt, vt, bt = (to_torch(x[tokens]).to(dev, dt) for x in (q, k, v, beta))
        gt = to_torch(g[tokens]).to(dev, f32)
        h0 = torch.from_numpy(pool[idx[real]].astype(np.float32)).to(dev)
        lens = (cu[real + 1] - cu[real])
        sub_cu = np.concatenate([[0], np.cumsum(lens)])
        if self.gpu:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

            fn = chunk_gated_delta_rule if chunked else fused_recurrent_gated_delta_rule
            out, hN = fn(qt[None], kt[None], vt[None], g=gt[None], beta=bt[None], scale=scale, initial_state=h0,
                         output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm,
                         cu_seqlens=torch.from_numpy(sub_cu).to(dev))
            out = out[0]
        else:
            from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule, naive_recurrent_gated_delta_rule

            if use_qk_l2norm:
                qt, kt = _l2norm(qt, l2norm_eps), _l2norm(kt, l2norm_eps)
            qt, kt = (x.repeat_interleave(HV // H, dim=1) for x in (qt, kt))
            outs, finals = [], []
            for n in range(len(real)):
                s = slice(int(sub_cu[n]), int(sub_cu[n + 1]))
                qkv, init = (qt[s][None], kt[s][None], vt[s][None]), h0[n:n + 1]
                if chunked:
                    on, hn = naive_chunk_gated_delta_rule(*qkv, gt[s][None], bt[s][None], scale=scale,
                                                          initial_state=init, output_final_state=True)
                else:
                    on, hn = naive_recurrent_gated_delta_rule(*qkv, bt[s][None], gt[s][None], scale=scale,
                                                              initial_state=init, output_final_state=True)
                outs.append(on[0, : s.stop - s.start])
                finals.append(hn)
            out, hN = torch.cat(outs), torch.cat(finals)
        o[tokens] = to_numpy(out)
        pool[idx[real]] = hN.float().cpu().numpy().astype(pool.dtype)
        return o, pool

    def recurrent(self, *args, state_write_interval, **kw):
        return self._run(*args, **kw, chunked=False)

    def chunked(self, *args, chunk_size=64, **kw):
        if chunk_size != 64:
            raise ValueError(f"chunk_size: FLA's chunk kernel uses 64, got {chunk_size}")
        return self._run(*args, **kw, chunked=True)


def _supports(cell) -> str | None:
    if cell.op == "chunked" and not defined_for(cell, "fla-chunk"):
        return (f"{activation(cell)} activations: FLA's chunk kernels run TF32 dots on fp32 inputs "
                "(fla/ops/gated_delta_rule/chunk_fwd.py: SOLVE_TRIL_DOT_PRECISION = 'tf32', and tl.dot's "
                "default), which the fla-chunk model emulates only in T's merge")
    return _whole_call(cell)


def _whole_call(cell) -> str | None:
    split, calls = cell.get("split"), cell.get("calls", 1)
    longest = max(max(L - split, min(L, split)) if split else -(-L // calls) for L in cell["lens"])
    every = cell["interval"] if cell.op == "recurrent" else 64
    if cell["state"] != "float32" and longest > every:
        return ("FLA keeps the state in float32 for a whole call and rounds it into the "
                f"{cell['state']} pool once at the end; this cell's oracle rounds it every {every} tokens")
    return None


def _xfail(cell) -> str | None:
    if cell.op == "chunked" and cell.get("v") == "near-max" and activation(cell) == "float16":
        return ("FLA stores each chunk's starting state in the activation dtype (chunk_gated_delta_rule_fwd_h: "
                "h = k.new_empty(...)); this cell's float32 state passes 65504, so float16 holds inf there "
                "(the fla-chunk oracle, rounding where FLA does, overflows too)")
    return None


def _make(name: str, gpu: bool) -> Backend:
    def run(cell, inputs):
        from conformance.families import gdn

        return gdn.run_with(FlaImpl(gpu), cell, inputs)

    return register(Backend(
        name=name, ops={"gdn": ("recurrent", "chunked")}, available=_available(gpu), run=run,
        supports=_supports if gpu else _whole_call, **({"xfail": _xfail} if gpu else {}),
        rounding_models={"gdn": "fla-chunk" if gpu else "exact"}, uses_gpu=gpu,
        argument_contract=False, path=paths.on_gpu if gpu else paths.fixed("cpu")))


_make("fla", gpu=True)
_make("fla-naive", gpu=False)
