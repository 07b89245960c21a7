"""What every TurboQuant decode launcher shares: argument checks, the preallocated split-KV
workspace, the query rotation kernel and the split-KV reduce (stage 2).

Split-KV convention (``reference.turboquant.numpy_ref.decode_partials`` is the ``align = 1`` case): split s
of sequence b covers tokens ``[s*W, min((s+1)*W, L_b))`` with ``W = ceil(L_b / S)`` rounded up to a
multiple of the launch's ``align`` (the grouped decode aligns splits to its tile); an empty split
writes nothing and the reducer skips it by recomputing the bounds (``tq_common.split_range``). A partial is ``[D + 1]`` fp32:
the split's normalised output, then its log-sum-exp (natural log). Sinks enter stage 1 of split 0
(``m = sink, l = 1``), so the reducer needs no sink argument.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import triton
import triton.language as tl

from optimized.triton.checks import (FLOAT_DTYPES, capturing, check_finite_once, check_output, check_positive,
                                     check_tensor, index_tensor)
from optimized.triton.tq_cache import CacheSpec, cache_spec
from optimized.triton.tq_common import split_range
from reference.turboquant.validate import softmax_scale, split_count

MAX_SPLITS = 64
# precision of the MMA decodes: "exact" (fp32 operands, IEEE products) or "act" (operands in the query's dtype)
PRECISIONS = ("exact", "act")
# MMA operand formats by query dtype under "act" ("ieee": fp32 operands, IEEE products)
MMA_OPERANDS = {"bfloat16": "bf16", "float16": "fp16", "float32": "ieee"}
ROTATE_ROWS, ROTATE_CHUNK = 16, 32  # query rows per rotation program, and the slice of R per tl.dot


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def mma_operands(precision, query) -> str:
    """The MMA operand format of a decode (a value of ``MMA_OPERANDS``): ``"ieee"`` for precision
    "exact", else the query's dtype (a float16 query never runs as bf16). ``precision`` None: "exact"
    under TRITON_INTERPRET=1 (its 16-bit arithmetic is broken), else "act". TypeError/ValueError
    naming ``query`` or ``precision``."""
    check_tensor("query", query, (None, None, None), FLOAT_DTYPES)
    precision = precision or ("exact" if interpreting() else "act")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    mma = "ieee" if precision == "exact" else MMA_OPERANDS[str(query.dtype).removeprefix("torch.")]
    if mma != "ieee" and interpreting():
        raise ValueError(f"precision 'act' with a {query.dtype} query is not available under TRITON_INTERPRET=1 "
                         "(broken 16-bit arithmetic); use precision 'exact'")
    return mma


class DecodeWorkspace:
    """Buffers of a decode launch, allocated once for the largest batch and reused, so a decode
    allocates nothing per call and can be captured in a CUDA graph: ``q_rot [max_batch, Hq, D]``
    fp32, ``partials [max_batch, Hq, max_splits, D + 1]`` fp32 and the
    argument-check flags ``[max_batch, 4]`` int32."""

    def __init__(self, max_batch: int, num_q_heads: int, head_size: int, max_splits: int = 32, device="cuda"):
        import torch

        for name, n in (("max_batch", max_batch), ("num_q_heads", num_q_heads), ("head_size", head_size)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be a positive integer, got {n!r}")
        if isinstance(max_splits, bool) or not isinstance(max_splits, int) or not 1 <= max_splits <= MAX_SPLITS:
            raise ValueError(f"max_splits must be an integer in [1, {MAX_SPLITS}], got {max_splits!r}")
        self.max_batch, self.num_q_heads, self.head_size, self.max_splits = max_batch, num_q_heads, head_size, max_splits
        self.q_rot = torch.empty(max_batch, num_q_heads, head_size, dtype=torch.float32, device=device)
        self.partials = torch.empty(max_batch, num_q_heads, max_splits, head_size + 1, dtype=torch.float32,
                                    device=device)
        self.flags = torch.empty(max_batch, 4, dtype=torch.int32, device=device)

    def fits(self, B: int, Hq: int, D: int, S: int, device) -> str | None:
        """None if a launch of this shape fits, else why not."""
        if self.q_rot.device != device:
            return f"workspace is on {self.q_rot.device}, the launch on {device}"
        if Hq != self.num_q_heads or D != self.head_size:
            return f"workspace is for Hq={self.num_q_heads}, D={self.head_size}; launch has Hq={Hq}, D={D}"
        if B > self.max_batch or S > self.max_splits:
            return f"workspace holds B<={self.max_batch}, splits<={self.max_splits}; launch has B={B}, splits={S}"
        return None


@dataclass(frozen=True)
class DecodeArgs:
    spec: CacheSpec
    B: int
    Hq: int
    G: int
    scale: float
    sinks: object  # fp32 [Hq] tensor or None
    block_table: object  # int32 [B, M] tensor (a Python list of rows is converted)
    seq_lens: object  # int32 [B] tensor (likewise)


def check_decode_args(query, kv_cache, block_table, seq_lens, *, preset, layout, rotation, scale, sinks,
                      num_seqs=None) -> DecodeArgs:
    """Validate an attention call over the cache (shapes, dtypes, cache geometry, a finite scale and
    rotation); ValueError/TypeError naming the argument. ``query [B, Hq, D]``; the tables have one
    row per sequence: B of them for decode, ``num_seqs`` when the query rows are packed tokens; as
    Python lists they are converted to int32 tensors on the cache's device (``DecodeArgs``)."""
    check_tensor("query", query, (None, None, None), FLOAT_DTYPES)
    B, Hq, D = query.shape
    check_positive("B (query rows)", B)
    if kv_cache is None or getattr(kv_cache, "dim", lambda: 0)() != 4:
        raise ValueError(f"kv_cache must be a 4-d uint8 tensor, got {getattr(kv_cache, 'shape', kv_cache)}")
    Hk = kv_cache.shape[2]
    if Hk < 1 or Hq % Hk:
        raise ValueError(f"query heads Hq={Hq} must be a multiple of the cache's kv heads Hk={Hk}")
    G = Hq // Hk
    spec = cache_spec(kv_cache, preset, D, Hk, layout)
    dev = kv_cache.device
    check_tensor("query", query, (B, Hq, D), FLOAT_DTYPES, dev)
    block_table, seq_lens = index_tensor("block_table", block_table, dev), index_tensor("seq_lens", seq_lens, dev)
    check_tables(block_table, seq_lens, B if num_seqs is None else num_seqs, kv_cache)
    if not spec.preset.key_fp8:
        if rotation is None:
            raise ValueError(f"rotation [D, D] is required for the MSE-key preset {spec.preset.name}")
        check_tensor("rotation", rotation, (D, D), ("float32",), dev, contiguous=True)
        check_finite_once("rotation", rotation)
    if sinks is not None:
        check_tensor("sinks", sinks, (Hq,), ("float32",), dev, contiguous=True)
    return DecodeArgs(spec, B, Hq, G, softmax_scale(scale, D), sinks, block_table, seq_lens)


def check_tables(block_table, seq_lens, B: int, kv_cache) -> None:
    """Shapes and dtypes of ``block_table [B, M]`` int32 (rows contiguous) and ``seq_lens [B]``
    int32; their values are checked by ``validate_values``."""
    dev = kv_cache.device
    check_tensor("block_table", block_table, (B, None), ("int32",), dev)
    check_tensor("seq_lens", seq_lens, (B,), ("int32",), dev, contiguous=True)
    if block_table.stride(1) != 1:
        raise ValueError(f"block_table rows must be contiguous, got strides {block_table.stride()}")
    check_positive("block_table columns", block_table.shape[1])


@triton.jit
def _validate_kernel(q_ptr, bt_ptr, seq_lens_ptr, sinks_ptr, flags_ptr, stride_bt, num_blocks,
                     ROWS_PER_SEQ: tl.constexpr, M: tl.constexpr, BS: tl.constexpr, HQD: tl.constexpr, HQ: tl.constexpr,
                     HAS_SINKS: tl.constexpr, CHUNK: tl.constexpr):
    """flags[b] = (seq_len out of [1, M*BS], a used block id out of [0, num_blocks), a NaN/Inf in
    the query rows of sequence b, a NaN/Inf sink): one program per sequence, 0/1 each."""
    b = tl.program_id(0)
    L = tl.load(seq_lens_ptr + b)
    bad_len = (L < 1) | (L > M * BS)
    used = tl.minimum(tl.maximum(tl.cdiv(L, BS), 0), M)
    bad_blk = 0
    for c0 in range(0, M, CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        blk = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + c, mask=c < used, other=0)
        bad_blk = tl.maximum(bad_blk, tl.max(((blk < 0) | (blk >= num_blocks)).to(tl.int32), axis=0))
    bad_q = 0
    for r in range(0, ROWS_PER_SEQ):  # constexpr: Triton 3.6's interpreter cannot range() over an int argument
        row = q_ptr + (b.to(tl.int64) * ROWS_PER_SEQ + r) * HQD
        for i0 in range(0, HQD, CHUNK):
            i = i0 + tl.arange(0, CHUNK)
            x = tl.load(row + i, mask=i < HQD, other=0.0).to(tl.float32)
            bad_q = tl.maximum(bad_q, tl.max((tl.abs(x) > 3.4e38).to(tl.int32) | (x != x).to(tl.int32), axis=0))
    bad_sink = 0
    if HAS_SINKS:
        for i0 in range(0, HQ, CHUNK):
            i = i0 + tl.arange(0, CHUNK)
            x = tl.load(sinks_ptr + i, mask=i < HQ, other=0.0)
            bad_sink = tl.maximum(bad_sink, tl.max((tl.abs(x) > 3.4e38).to(tl.int32) | (x != x).to(tl.int32), axis=0))
    tl.store(flags_ptr + b * 4 + 0, bad_len.to(tl.int32))
    tl.store(flags_ptr + b * 4 + 1, bad_blk)
    tl.store(flags_ptr + b * 4 + 2, bad_q)
    tl.store(flags_ptr + b * 4 + 3, bad_sink)


def validate_values(query, block_table, seq_lens, sinks, num_blocks: int, block_size: int, flags,
                    rows_per_seq: int = 1) -> None:
    """Check the values of a decode's tables and query on the device (one small kernel, one
    device-to-host copy, no device allocation: ``flags`` is a preallocated int32 ``[>= B, 4]``):
    ``seq_lens`` in ``[1, M * block_size]``, used block ids in ``[0, num_blocks)``, finite query
    and sinks. Skipped while a CUDA graph is captured. ``query`` must be contiguous, with
    ``rows_per_seq`` query rows per sequence (0: the caller checks the query itself)."""
    if capturing(query):
        return
    B, M = block_table.shape
    Hq, D = query.shape[-2], query.shape[-1]
    _validate_kernel[(B,)](query, block_table, seq_lens, sinks if sinks is not None else query, flags,
                           block_table.stride(0), num_blocks, ROWS_PER_SEQ=rows_per_seq, M=M, BS=block_size, HQD=Hq * D,
                           HQ=Hq, HAS_SINKS=sinks is not None, CHUNK=256)
    bad = flags[:B].cpu().numpy()
    names = ((0, "seq_lens", f"must be in [1, block_table columns * block_size = {M * block_size}]"),
             (1, "block_table", f"entries of used columns must be in [0, {num_blocks})"),
             (2, "query", "holds NaN or Inf"), (3, "sinks", "holds NaN or Inf"))
    for col, name, what in names:
        rows = bad[:, col].nonzero()[0]
        if len(rows):
            raise ValueError(f"{name} {what} (sequence(s) {rows[:8].tolist()})")


def default_num_splits(B: int, programs_per_row: int, max_tokens: int, tile: int, device, max_splits: int,
                       programs_per_sm: int = 4) -> int:
    """Enough programs to fill the GPU (about ``programs_per_sm`` per SM, ``programs_per_row`` per
    sequence and split), never more splits than tiles; decided from shapes only, so a captured graph
    keeps it. The interpreter runs programs one by one: 1."""
    if interpreting() or device.type != "cuda":
        return 1
    import torch

    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = triton.next_power_of_2(triton.cdiv(programs_per_sm * sms, B * programs_per_row))
    return max(1, min(want, max_splits, triton.cdiv(max_tokens, tile)))


@triton.jit
def _rotate_kernel(q_ptr, r_ptr, out_ptr, sq_b, sq_h, ROWS, HQ: tl.constexpr, D: tl.constexpr,
                   ROTATE: tl.constexpr, BLOCK_R: tl.constexpr, CHUNK: tl.constexpr):
    """``out[r, :] = f32(q[r // HQ, r % HQ, :]) @ R`` for ``BLOCK_R`` query rows per program (fp32
    products and sums: ``input_precision="ieee"``), or a plain fp32 copy. A block of rows shares
    each load of R (one row per program read all of R, 64 KiB, 2048 times per decode step)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = r < ROWS
    rows = q_ptr + (r // HQ).to(tl.int64) * sq_b + (r % HQ) * sq_h
    cols = tl.arange(0, D)
    if ROTATE:
        acc = tl.zeros((BLOCK_R, D), tl.float32)
        for i0 in tl.static_range(0, D, CHUNK):
            i = i0 + tl.arange(0, CHUNK)
            x = tl.load(rows[:, None] + i[None, :], mask=live[:, None], other=0.0).to(tl.float32)
            acc = tl.dot(x, tl.load(r_ptr + i[:, None] * D + cols[None, :]), acc, input_precision="ieee")
    else:
        acc = tl.load(rows[:, None] + cols[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    tl.store(out_ptr + r.to(tl.int64)[:, None] * D + cols[None, :], acc, mask=live[:, None])


def rotate_queries(query, rotation, out, rotate: bool) -> None:
    """``out[:B] = f32(query) @ rotation`` (or a copy when ``rotate`` is False); query [B, Hq, D]."""
    B, Hq, D = query.shape
    if query.stride(2) != 1:
        raise ValueError(f"query rows must be contiguous, got strides {query.stride()}")
    _rotate_kernel[(triton.cdiv(B * Hq, ROTATE_ROWS),)](query, rotation if rotate else out, out, query.stride(0),
                                                        query.stride(1), B * Hq, HQ=Hq, D=D, ROTATE=rotate,
                                                        BLOCK_R=ROTATE_ROWS, CHUNK=ROTATE_CHUNK)


@triton.jit
def _reduce_kernel(part_ptr, seq_lens_ptr, out_ptr, so_b, so_h, HQ: tl.constexpr, D: tl.constexpr,
                   S: tl.constexpr, MAXS: tl.constexpr, S_P2: tl.constexpr, ALIGN: tl.constexpr):
    """Merge the non-empty splits of (b, h): ``out = sum_s w_s o_s / sum_s w_s``,
    ``w_s = exp(lse_s - max lse)``."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, S_P2)
    start, end = split_range(seq_lens_ptr, b, s, S, ALIGN)
    live = (s < S) & (start < end)
    base = part_ptr + ((b.to(tl.int64) * HQ + h) * MAXS) * (D + 1)
    lse = tl.load(base + s * (D + 1) + D, mask=live, other=float("-inf"))
    m = tl.max(lse, axis=0)
    w = tl.where(live, tl.exp(lse - m), 0.0)
    d = tl.arange(0, D)
    o = tl.load(base + s[:, None] * (D + 1) + d[None, :], mask=live[:, None], other=0.0)
    res = tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + b.to(tl.int64) * so_b + h * so_h + d, res.to(out_ptr.dtype.element_ty))


_TABLES: dict = {}


def _half(mma: str):
    """The torch dtype of a 16-bit MMA operand format ("bf16", "fp16")."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}[mma]


def centroid_table(p, D: int, device, mma: str = "ieee"):
    """Device Lloyd-Max centroids ``[2^bits]`` of preset ``p``: fp32 (``mma`` "ieee"), or the bit patterns
    of ``mma``'s 16-bit dtype ("bf16", "fp16"; round to nearest even) in int32 (FP8 keys: a 1-element
    dummy). Built once per (bits, D, format, device), keyed by value, so launches allocate nothing."""
    import torch

    from reference.turboquant.lloyd_max import centroids

    key = (p.key_fp8, p.key_bits, D, str(device), mma)
    if key not in _TABLES:
        table = torch.zeros(1) if p.key_fp8 else torch.from_numpy(centroids(p.key_bits, D)).to(torch.float32)
        if mma != "ieee":
            table = table.to(_half(mma)).view(torch.int16).to(torch.int32) & 0xFFFF
        _TABLES[key] = table.contiguous().to(device)
    return _TABLES[key]


def pair_table(p, D: int, device, mma: str = "ieee"):
    """The 4-bit pair table ``[256]`` of preset ``p``: entry ``byte`` packs the two dequantized
    codes of one key byte, ``c[byte & 15]`` in the low half and ``c[byte >> 4]`` in the high half:
    int64 of two fp32 bit patterns (``mma`` "ieee"), or int32 of two bit patterns of ``mma``'s 16-bit
    dtype ("bf16", "fp16"; round to nearest even). Built on the host from ``centroid_table`` once per (D,
    format, device), keyed by value like ``centroid_table``, so launches allocate and copy nothing."""
    import torch

    if p.key_fp8 or p.key_bits != 4:
        raise ValueError(f"a pair table needs 4-bit MSE keys, got preset {p.name}")
    key = ("pairs", D, str(device), mma)
    if key not in _TABLES:
        byte = torch.arange(256)
        c = centroid_table(p, D, "cpu")
        pairs = torch.stack([c[byte & 15], c[byte >> 4]], dim=1)  # [256, 2]: little-endian, low half first
        packed = pairs.view(torch.int64) if mma == "ieee" else pairs.to(_half(mma)).view(torch.int32)
        _TABLES[key] = packed.reshape(256).contiguous().to(device)
    return _TABLES[key]


def prepare_out(out, B: int, Hq: int, D: int, dtype, device):
    """``out`` checked as strictly as the inputs (``checks.check_output``), or a new tensor."""
    import torch

    if out is None:
        return torch.empty(B, Hq, D, dtype=dtype, device=device)
    return check_output("out", out, (B, Hq, D), FLOAT_DTYPES, device)


def workspace_for(workspace, B: int, Hq: int, D: int, S: int, device) -> DecodeWorkspace:
    """The caller's workspace (checked), or a fresh one sized for this call."""
    if workspace is None:
        return DecodeWorkspace(B, Hq, D, max(S, 1), device)
    if not isinstance(workspace, DecodeWorkspace):
        raise TypeError(f"workspace must be a DecodeWorkspace or None, got {type(workspace).__name__}")
    why = workspace.fits(B, Hq, D, S, device)
    if why:
        raise ValueError(f"workspace: {why}")
    return workspace


def begin_split_decode(query, kv_cache, block_table, seq_lens, *, preset, layout, rotation, scale, sinks,
                       num_kv_splits, workspace, out, block_n: int):
    """The prologue the split-KV decodes share: ``check_decode_args``, then ``split_decode_prologue``.
    Returns ``(args, S, ws, out)``; the kernels read the tables from ``args``."""
    a = check_decode_args(query, kv_cache, block_table, seq_lens, preset=preset, layout=layout,
                          rotation=rotation, scale=scale, sinks=sinks)
    return (a, *split_decode_prologue(a, query, kv_cache, rotation, num_kv_splits=num_kv_splits,
                                      workspace=workspace, out=out, block_n=block_n))


def split_decode_prologue(a: DecodeArgs, query, kv_cache, rotation, *, num_kv_splits, workspace, out, block_n: int,
                          programs_per_row: int | None = None, programs_per_sm: int = 4):
    """For checked arguments ``a``: the split count (None: ``default_num_splits`` with
    ``programs_per_row`` programs per sequence and split, default one per kv head; else an integer in
    ``[1, workspace.max_splits]``, or ``[1, MAX_SPLITS]`` without a workspace), the workspace and output
    (no allocation when both are given), the device-side value checks, and the rotated queries in
    ``ws.q_rot`` (FP8 keys: copied unrotated). Returns ``(S, ws, out)``."""
    spec, B, Hq = a.spec, a.B, a.Hq
    D = spec.head_size
    has_ws = isinstance(workspace, DecodeWorkspace)
    if num_kv_splits is None:
        S = default_num_splits(B, programs_per_row or spec.num_kv_heads, a.block_table.shape[1] * spec.block_size,
                               block_n, kv_cache.device, workspace.max_splits if has_ws else 32, programs_per_sm)
    else:
        S = split_count(num_kv_splits, workspace.max_splits if has_ws else MAX_SPLITS)
    ws = workspace_for(workspace, B, Hq, D, S, kv_cache.device)
    out = prepare_out(out, B, Hq, D, query.dtype, kv_cache.device)
    validate_values(query.contiguous(), a.block_table, a.seq_lens, a.sinks, kv_cache.shape[0], spec.block_size,
                    ws.flags)
    rotate_queries(query, rotation, ws.q_rot, rotate=not spec.preset.key_fp8)
    return S, ws, out


def reduce_partials(ws: DecodeWorkspace, seq_lens, out, S: int, align: int = 1) -> None:
    """Stage 2: ``out [B, Hq, D]`` from the partials of ``S`` splits aligned to ``align`` tokens."""
    B, Hq, D = out.shape
    _reduce_kernel[(B, Hq)](ws.partials, seq_lens, out, out.stride(0), out.stride(1),
                            HQ=Hq, D=D, S=S, MAXS=ws.max_splits, S_P2=triton.next_power_of_2(S), ALIGN=align)
