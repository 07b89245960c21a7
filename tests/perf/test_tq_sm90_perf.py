"""Performance gate of the sm_90 TurboQuant decode (``tq_decode_sm90``, operands built in registers) on an
NVIDIA compute capability 9.0 GPU, a ratio of two things measured in the same run: the whole decode step
(rotation, kernel, reduce; CUDA-graph median) <= 0.5x torch SDPA decode on a bf16 cache of the same shape;
the fraction of the device copy bandwidth it streams (compressed bytes once per kv head) is recorded.
Shape: B=32, Hk=8, G=8, D=128, turboquant_4bit_nc, SoA, block 16, L in {8192, 32768}.
"""
import os

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available()
    or torch.cuda.get_device_capability() != (9, 0) or bool(getattr(torch.version, "hip", None)),
    reason="sm_90-only gate: needs an NVIDIA GPU of compute capability 9.0")]

B, HK, G, D = 32, 8, 8, 128


@pytest.mark.parametrize("L", [8192, 32768])
def test_sm90_decode_at_most_half_of_bf16_sdpa(benchmark, L):
    from optimized.triton.bench import PRESET, build_case, copy_bandwidth, graph_ms, time_sdpa
    from optimized.triton.tq_decode_launch import DecodeWorkspace
    from optimized.triton.tq_decode_sm90 import decode_sm90
    from reference.turboquant.presets import preset

    case = build_case(B, HK, G, D, L)
    ws = DecodeWorkspace(B, HK * G, D)
    out = torch.empty(B, HK * G, D, dtype=torch.bfloat16, device="cuda")

    def decode():
        decode_sm90(case["query"], case["cache"], case["block_table"], case["seq_lens"], preset=PRESET,
                    layout="soa", rotation=case["rotation"], workspace=ws, out=out)

    ms = graph_ms(decode)
    sdpa_ms = time_sdpa(B, HK, G, D, L)
    frac = B * L * HK * preset(PRESET).slot_size(D) / (ms * 1e-3) / copy_bandwidth()
    benchmark.extra_info.update(ms=ms, sdpa_ms=sdpa_ms, vs_sdpa=ms / sdpa_ms, frac_copy=frac)
    benchmark.pedantic(lambda: (decode(), torch.cuda.synchronize()), rounds=20, warmup_rounds=2)
    assert ms <= 0.5 * sdpa_ms, (f"sm90 decode {ms:.4f} ms vs SDPA {sdpa_ms:.4f} ms = {ms / sdpa_ms:.3f}x (gate 0.5x; "
                                 f"{frac:.1%} of copy)")
