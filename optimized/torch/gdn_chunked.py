"""Chunked gated delta rule in plain torch ops: what a user runs without custom kernels.

``chunked(q, k, v, g, beta, cu_seqlens, state, state_indices, ...)`` with the reference's
arguments, on torch tensors: q, k [T,H,K]; v [T,HV,V]; g, beta [T,HV] (g fp32); cu_seqlens and
state_indices integer; the pool ``state`` [S,HV,K,V] (float32, bfloat16 or float16) is updated in
place; returns o float32 [T,HV,V] (rows of padding sequences, slot -1, are zero).

Work is batched: the intra-chunk UT transform of every chunk of every sequence and head at once
(bf16 matmuls, one batched triangular solve), then one loop over chunk positions batched over
sequences and heads for the state recurrence.

Rounding model ("bf16-gemm"): q, k after l2norm and scale, the -beta*D*kk^T matrix, T, W, U, the
chunk-start state copy, v_new and the other GEMM operands are bf16, as in the CPU chunk kernel's
model; in addition every bf16 matmul returns its result rounded to bf16 (torch's bf16 GEMM), and
the state increment is such a bf16 result added to the fp32 state. The state is stored (nearest
even) at chunk ends every ``state_write_interval`` tokens and at each sequence's end.
"""
from __future__ import annotations

import torch

from reference.arguments import indices
from reference.gdn.arguments import decays, scalars

_POOL_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _check(q, k, v, g, beta, cu_seqlens, state, state_indices, state_dtype, chunk_size, interval, scale,
           l2norm_eps):
    """The reference's checks on torch tensors; returns (cu_seqlens, state_indices) as int64 tensors
    (Python lists of integers are converted)."""
    scalars(scale, l2norm_eps)
    for name, x, nd in (("q", q, 3), ("k", k, 3), ("v", v, 3), ("g", g, 2), ("beta", beta, 2),
                        ("state", state, 4)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{name}: expected a floating tensor, got {x.dtype}")
        if x.dim() != nd:
            raise ValueError(f"{name}: expected {nd} dimensions, got shape {tuple(x.shape)}")
    T, H, K = q.shape
    HV, V = v.shape[1:]
    if T == 0:
        raise ValueError("q: zero-length (T=0)")
    if k.shape != q.shape or v.shape[0] != T:
        raise ValueError(f"k, v: expected [T={T}, H, K] and [T, HV, V], got {tuple(k.shape)}, {tuple(v.shape)}")
    if HV % H:
        raise ValueError(f"v: HV={HV} value heads is not a multiple of H={H} key heads")
    if g.shape != (T, HV) or beta.shape != (T, HV):
        raise ValueError(f"g, beta: expected [T={T}, HV={HV}], got {tuple(g.shape)}, {tuple(beta.shape)}")
    if state_dtype not in _POOL_TORCH_DTYPES or state.dtype != _POOL_TORCH_DTYPES[state_dtype]:
        raise TypeError(f"state: expected dtype {state_dtype} (state_dtype), got {state.dtype}")
    if tuple(state.shape[1:]) != (HV, K, V):
        raise ValueError(f"state: expected [S, {HV}, {K}, {V}], got {tuple(state.shape)}")
    cu_seqlens, state_indices = (torch.as_tensor(indices(n, x)) for n, x in (("cu_seqlens", cu_seqlens),
                                                                              ("state_indices", state_indices)))
    for name, x in (("cu_seqlens", cu_seqlens), ("state_indices", state_indices)):
        if x.is_floating_point() or x.dim() != 1:
            raise TypeError(f"{name}: expected a 1-D integer tensor, got {x.dtype} {tuple(x.shape)}")
    cu = cu_seqlens.long()
    if cu[0] != 0 or cu[-1] != T or bool((cu[1:] <= cu[:-1]).any()):
        raise ValueError("cu_seqlens: expected strictly increasing offsets from 0 to T")
    idx = state_indices.long()
    if idx.numel() != cu.numel() - 1:
        raise ValueError(f"state_indices: expected [N={cu.numel() - 1}], got {tuple(idx.shape)}")
    if bool(((idx < -1) | (idx >= state.shape[0])).any()):
        raise ValueError(f"state_indices: slot index out of range [-1, {state.shape[0]})")
    used = idx[idx >= 0]
    if used.unique().numel() != used.numel():
        raise ValueError("state_indices: a slot appears twice")
    if chunk_size < 1 or interval < 1 or interval % chunk_size:
        raise ValueError(f"state_write_interval: expected a multiple of chunk_size={chunk_size}, got {interval}")
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name}: contains NaN or Inf")
    decays(g.detach().float().cpu().numpy())
    return cu, idx


def _l2norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _grid(cu: torch.Tensor, seqs: torch.Tensor, C: int):
    """Token index and validity [N, nC, C] of the chunks of the sequences ``seqs``."""
    starts, lens = cu[:-1][seqs], (cu[1:] - cu[:-1])[seqs]
    nC = int((lens.max() + C - 1) // C)
    t = torch.arange(nC * C).view(1, nC, C)
    valid = t < lens.view(-1, 1, 1)
    return torch.where(valid, starts.view(-1, 1, 1) + t, 0), valid, lens


def _on_grid(x: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Packed [T, ...] -> [N, nC, C, ...] with zeros past each sequence's end."""
    out = x[pos]
    return out * valid.view(valid.shape + (1,) * (out.dim() - 3)).to(out.dtype)


def chunked(q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale=None, use_qk_l2norm=True,
            l2norm_eps=1e-6, state_dtype="float32", state_write_interval=None, chunk_size=64):
    """Chunked GDN forward (module docstring); updates ``state`` in place, returns o float32."""
    C = int(chunk_size)
    interval = C if state_write_interval is None else int(state_write_interval)
    cu, idx = _check(q, k, v, g, beta, cu_seqlens, state, state_indices, state_dtype, C, interval, scale, l2norm_eps)
    T, H, K = q.shape
    HV, V = v.shape[1:]
    o = torch.zeros(T, HV, V, dtype=torch.float32)
    seqs = torch.nonzero(idx >= 0).flatten()
    if seqs.numel() == 0:
        return o
    bf16, f32 = torch.bfloat16, torch.float32
    qf, kf = q.float(), k.float()
    if use_qk_l2norm:
        qf, kf = _l2norm(qf, l2norm_eps), _l2norm(kf, l2norm_eps)
    qf = qf * (K ** -0.5 if scale is None else scale)
    group = HV // H
    qb = qf.repeat_interleave(group, dim=1).to(bf16)                     # [T, HV, K]
    kb = kf.repeat_interleave(group, dim=1).to(bf16)
    pos, valid, lens = _grid(cu, seqs, C)
    # [N, nC, HV, C, D] and [N, nC, HV, C]: heads before the chunk axis for batched matmuls
    heads = lambda x: x.transpose(2, 3)
    qc, kc = heads(_on_grid(qb, pos, valid)), heads(_on_grid(kb, pos, valid))
    vc = heads(_on_grid(v.to(bf16), pos, valid))
    gc, bc = heads(_on_grid(g.float(), pos, valid)), heads(_on_grid(beta.float(), pos, valid))

    # intra-chunk, all chunks and heads at once
    G = gc.cumsum(-1)
    lower = torch.ones(C, C, dtype=torch.bool).tril()
    D = torch.exp(torch.where(lower, G.unsqueeze(-1) - G.unsqueeze(-2), float("-inf")))
    kk = (kc @ kc.transpose(-1, -2)).float()
    M = (bc.unsqueeze(-1) * kk * D).tril(-1).to(bf16)
    eye = torch.eye(C)
    Tm = torch.linalg.solve_triangular(eye + M.float(), eye.expand(M.shape), upper=False,
                                       unitriangular=True).to(bf16)
    eG = torch.exp(G).unsqueeze(-1)
    W = Tm @ (bc.unsqueeze(-1) * eG * kc.float()).to(bf16)
    U = Tm @ (bc.unsqueeze(-1) * vc.float()).to(bf16)
    Qg = (qc.float() * eG).to(bf16)
    Aqk = ((qc @ kc.transpose(-1, -2)).float() * D).to(bf16)
    to_end = (kc.float() * torch.exp(G[..., -1:] - G).unsqueeze(-1)).to(bf16).transpose(-1, -2)
    last = torch.exp(G[..., -1]).unsqueeze(-1).unsqueeze(-1)           # [N, nC, HV, 1, 1]

    # inter-chunk recurrence: one step per chunk position, batched over sequences and heads
    S = state[idx[seqs]].float()                                        # [N, HV, K, V]
    sdt = _POOL_TORCH_DTYPES[state_dtype]
    o_grid = torch.empty(len(seqs), pos.shape[1], HV, C, V)
    for c in range(pos.shape[1]):
        S_op = S.to(bf16)
        v_new = (U[:, c].float() - (W[:, c] @ S_op).float()).to(bf16)
        o_grid[:, c] = (Qg[:, c] @ S_op).float() + (Aqk[:, c] @ v_new).float()
        S_next = last[:, c] * S + (to_end[:, c] @ v_new).float()
        done = torch.clamp(lens - c * C, max=C) > 0                    # sequences with this chunk
        end = torch.minimum(torch.full_like(lens, (c + 1) * C), lens)
        write = done & ((end % interval == 0) | (end == lens))
        if sdt != f32:
            S_next = torch.where(write.view(-1, 1, 1, 1), S_next.to(sdt).float(), S_next)
        S = torch.where(done.view(-1, 1, 1, 1), S_next, S)
    state[idx[seqs]] = S.to(sdt)
    o_tok = o_grid.transpose(2, 3)                                     # [N, nC, C, HV, V]
    o[pos[valid]] = o_tok[valid]
    return o
