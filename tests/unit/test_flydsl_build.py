"""The FlyDSL kernels compile to gfx950 ISA without a GPU and use the CDNA4 MFMA they are
written for; the same source for gfx942 (CDNA3) fails on that instruction."""
import pytest

from optimized.flydsl import build

pytestmark = pytest.mark.skipif(build.toolchain_problem() is not None,
                                reason=f"ISA toolchain: {build.toolchain_problem()}")


@pytest.fixture(scope="module")
def gfx950(tmp_path_factory):
    return build.build("gfx950", tmp_path_factory.mktemp("isa950"))


def test_every_variant_compiles_for_gfx950_with_the_cdna4_mfma(gfx950):
    assert [a.name for a in gfx950] == [build.variant_name(g, bs) for g, bs in build.VARIANTS]
    for a in gfx950:
        assert a.ok, f"{a.name}: {a.error}"
        text = a.path.read_text()
        assert build.MFMA in text
        # 2 tiles per partition x (8 QK + 8 PV) MFMAs, fully unrolled
        assert a.mfma_count == 32, a.name


def test_isa_metadata_reports_registers_lds_and_no_spills(gfx950):
    for a in gfx950:
        md = a.metadata
        assert 0 < md["vgpr_count"] <= 512 and md["sgpr_count"] > 0, md
        assert md["lds_bytes"] == 16 * 4 + 16 * 32 * 2 + 128 * 32 * 2, md  # centroids, P, V^T tiles
        assert md["vgpr_spill_count"] == 0 and md["scratch_bytes"] == 0, md


def test_gfx942_build_fails_on_the_cdna4_only_mfma(tmp_path):
    a = build.compile_one(8, 16, "gfx942", tmp_path)
    assert not a.ok
    assert "mfma.f32.16x16x32.bf16" in a.error, a.error


def test_read_metadata_parses_the_amdhsa_note():
    text = "  - .agpr_count:     0\n    .group_segment_fixed_size: 9280\n    .vgpr_count:     106\n"
    assert build.read_metadata(text) == {"agpr_count": 0, "lds_bytes": 9280, "vgpr_count": 106}
