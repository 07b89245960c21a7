"""Performance gates of the Triton TurboQuant decode on a GPU (issue 6), each a ratio of two
things measured in the same run (optimized/triton/bench.py states the byte model):

- default grouped decode (tq_decode_grouped) time <= 0.35x torch SDPA decode on a bf16 cache of the same shape;
- its achieved bandwidth (compressed bytes once per kv head) >= 70% of a device-to-device copy.
Shape: B=32, Hk=8, G=8, D=128, turboquant_4bit_nc, SoA, L in {8192, 32768}.
"""
import os

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available(),
    reason="GPU-only gate: needs a CUDA/ROCm GPU (the CPU interpreter times nothing meaningful)")]

B, HK, G, D = 32, 8, 8, 128


@pytest.fixture(scope="module")
def copy_bps():
    from optimized.triton.bench import copy_bandwidth

    return copy_bandwidth()


@pytest.mark.parametrize("L", [8192, 32768])
def test_grouped_decode_beats_bf16_sdpa_and_streams_near_copy_bandwidth(benchmark, copy_bps, L):
    from optimized.triton.bench import PRESET, build_case, graph_ms, time_sdpa
    from optimized.triton.tq_decode_launch import DecodeWorkspace
    from optimized.triton.tq_decode_grouped import decode_grouped
    from reference.turboquant.presets import preset

    case = build_case(B, HK, G, D, L)
    ws = DecodeWorkspace(B, HK * G, D)
    out = torch.empty(B, HK * G, D, dtype=torch.bfloat16, device="cuda")

    def decode():
        decode_grouped(case["query"], case["cache"], case["block_table"], case["seq_lens"], preset=PRESET,
                        layout="soa", rotation=case["rotation"], workspace=ws, out=out)

    ms = graph_ms(decode)
    sdpa_ms = time_sdpa(B, HK, G, D, L)
    tq_bytes = B * L * HK * preset(PRESET).slot_size(D)
    frac = tq_bytes / (ms * 1e-3) / copy_bps
    benchmark.extra_info.update(ms=ms, sdpa_ms=sdpa_ms, vs_sdpa=ms / sdpa_ms, frac_copy=frac,
                                bf16_equiv_TBps=B * L * HK * D * 4 / (ms * 1e-3) / 1e12)
    benchmark.pedantic(lambda: (decode(), torch.cuda.synchronize()), rounds=20, warmup_rounds=2)
    assert ms <= 0.35 * sdpa_ms, f"decode {ms:.4f} ms vs SDPA {sdpa_ms:.4f} ms = {ms / sdpa_ms:.3f}x (gate 0.35x)"
    assert frac >= 0.70, f"decode streams {frac:.1%} of the copy bandwidth (gate 70%)"
