"""Configurations of the sm_90 decode as conformance backends, for runs that judge them beside the
default ``triton-sm90`` on the same cells (``KERNEL_LAB_BACKEND_MODULES=bench.probes.sm90_variants``;
the runner's workers import it too). Each is ``triton-sm90`` with launch options (``VARIANTS``); the
float16 twins of the full tier's cells (``fp16_twins``) hold the float16 paths to its model (act-mma-table) on
every shape the bfloat16 cells have.
"""
from __future__ import annotations

from conformance import families
from conformance.cells import make_cell
from conformance.registry import Backend, get, register

# name -> decode_sm90 options
VARIANTS = {
    "triton-sm90-regs": dict(stages=1),
    "triton-sm90-ring2": dict(stages=2),
    "triton-sm90-n32": dict(stages=4, block_n=32),
    "triton-sm90-fp16-integer": dict(fp16_values="integer"),
}


def _make(name: str, options: dict) -> Backend:
    default = get("triton-sm90")

    def run(cell, inputs):
        from conformance.backends.triton_kernels import TritonImpl

        return families.get(cell.family).run_with(TritonImpl("sm90", "cuda", "act", options), cell, inputs)

    return register(Backend(name=name, ops=default.ops, available=default.available, run=run,
                            supports=default.supports, rounding_models=default.rounding_models,
                            timeout_s=default.timeout_s, uses_gpu=True))


for _name, _options in VARIANTS.items():
    _make(_name, _options)


def fp16_twins(cells) -> list:
    """The cells with ``act=bfloat16`` again with ``act=float16`` (new ids; the same shapes and seeds)."""
    out = []
    for c in cells:
        if c.get("act") == "bfloat16":
            params = {k: ("float16" if k == "act" else v) for k, v in c.params}
            out.append(make_cell(c.family, c.op, seed=c.seed, **params))
    return out
