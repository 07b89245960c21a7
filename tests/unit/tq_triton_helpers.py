"""Shared setup of the Triton TurboQuant unit tests: the device they run on (the CPU through the
interpreter when tests/conftest.py chose ``TRITON_INTERPRET=1``, the GPU otherwise) and small
caches written by the NumPy reference store."""
import os

import numpy as np
import torch

from reference.turboquant import numpy_ref as R

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


def t(x):
    return None if x is None else torch.from_numpy(np.ascontiguousarray(x)).to(DEVICE)


def make_case(preset, layout, D=64, Hk=2, G=3, bs=16, lens=(5, 37), sinks=False, seed=0):
    """(query [B, Hk*G, D] f32, cache, block_table, seq_lens, rotation, sinks) as NumPy, the cache
    written by the reference store through a shuffled block table with spare columns."""
    rng = np.random.default_rng(seed)
    p = R.preset(preset)
    B = len(lens)
    M = max(-(-L // bs) for L in lens) + 1
    nb = B * M + 2
    rot = None if p.key_fp8 else R.random_rotation(D, seed + 1)
    cache = rng.integers(0, 256, (nb, bs, Hk, p.slot_size(D)), dtype=np.uint8)
    bt = rng.permutation(nb)[: B * M].reshape(B, M).astype(np.int32)
    for b, L in enumerate(lens):
        tok = np.arange(L)
        slots = bt[b, tok // bs] * bs + tok % bs
        R.store(cache, rng.standard_normal((L, Hk, D)).astype(np.float32),
                rng.standard_normal((L, Hk, D)).astype(np.float32), slots, preset, layout, rot)
    q = rng.standard_normal((B, Hk * G, D)).astype(np.float32)
    sk = rng.uniform(-2, 4, Hk * G).astype(np.float32) if sinks else None
    return q, cache, bt, np.array(lens, np.int32), rot, sk
