"""The sm_90 GDN decode's loading options, checked on the host (the kernel itself needs an sm_90 GPU:
``bench/probes/gdn_decode_sm90.py`` checks it there): which options go together, and how many programs of a
persistent grid a multiprocessor holds; the spec decode's tile (``spec_config``)."""
import pytest

from optimized.triton import gdn_decode_sm90 as sm90


def test_every_ring_fits_the_shared_memory_of_a_program_for_every_pool_dtype():
    for stages in sm90.STAGES:
        for size in (2, 4):
            assert stages * sm90.HEAD * sm90.HEAD * size + sm90.SMEM_SCRATCH <= sm90.SMEM_LIMIT, (stages, size)


@pytest.mark.parametrize("options, match", [
    (dict(stages=1), "stages"), (dict(stages=4), "stages"), (dict(stages=True), "stages"),
    (dict(stages=2, prefetch=True), "prefetch, stages"), (dict(persistent=True), "persistent"),
    (dict(stages=2, registers=16), "registers"), (dict(registers=256), "registers"),
    (dict(registers=168.0), "registers"),
])
def test_options_that_do_not_go_together_are_refused_by_name(options, match):
    with pytest.raises(ValueError, match=match):
        sm90.check_options(**options)


def test_good_options_pass():
    for options in (dict(), dict(prefetch=True), dict(stages=2), dict(stages=3, persistent=True),
                    dict(stages=2, persistent=True, registers=168)):
        sm90.check_options(**options)


def test_programs_a_multiprocessor_holds():
    # 255 registers (8 Ki a warp): two programs of 4 warps; at 168 (5376 a warp) three
    assert sm90.programs_per_sm(0, 2, 4) == 2
    assert sm90.programs_per_sm(2, 2, 4) == 2 and sm90.programs_per_sm(2, 2, 4, registers=168) == 3
    # shared memory: a 16-bit ring of 3 stages (96 KiB) two a multiprocessor, a float32 ring of 2 (128 KiB) one
    assert sm90.programs_per_sm(3, 2, 4, registers=168) == 2 and sm90.programs_per_sm(2, 4, 4) == 1


def test_the_spec_decode_halves_its_v_block_while_the_grid_is_small_against_the_multiprocessors():
    # Qwen3-Next heads on 132 multiprocessors: N=128 (4096 pairs) fills them at whole V; N=32 (1024) takes
    # blocks of one warp's 32 columns (a 16-bit pool at 8 lanes along K: 4 lanes x 8 columns)
    assert sm90.spec_config(2, 128, items=128 * 32, sms=132) == (8, 8, 4, 128)
    assert sm90.spec_config(2, 128, items=32 * 32, sms=132) == (8, 8, 4, 128)
    assert sm90.spec_config(2, 128, items=12 * 32, sms=132) == (8, 8, 2, 64)
    assert sm90.spec_config(2, 128, items=8 * 32, sms=132) == (8, 8, 1, 32)
    # a float32 pool: 16 columns a warp, so a single pair on many multiprocessors stops at one warp
    assert sm90.spec_config(4, 128, items=1, sms=132) == (4, 8, 1, 16)
    assert sm90.spec_config(4, 128, block_v=64) == (4, 8, 4, 64)
    assert sm90.spec_config(2, 128, lanes_k=16, block_v=64) == (8, 16, 4, 64)


@pytest.mark.parametrize("options, match", [
    (dict(block_v=16), "block_v"), (dict(block_v=48), "block_v"), (dict(block_v=256), "block_v"),
    (dict(lanes_k=3, block_v=128), "lanes_k"),
])
def test_spec_tiles_that_do_not_fit_are_refused_by_name(options, match):
    with pytest.raises(ValueError, match=match):
        sm90.spec_config(2, 128, **options)
