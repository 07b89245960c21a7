"""Where the copy ceiling's rate comes from: a device copy of uint8 buffers at the decode bench's sizes
(its L=8192 and L=32768 bytes, ``bench.gpu_ceilings.copy_bytes``) and at 563 MB and 2.25 GB, four ways: torch
``copy_`` launched eagerly (timed with device events) and replayed from a CUDA graph (a captured
``cudaMemcpyAsync``: a graph memcpy node), and the Triton copy kernel of ``bench.gpu_ceilings`` both ways.
Rates count bytes read plus bytes written; medians of 3 samples of ``bench.timing``. With ``--variants``,
instead: configurations of the Triton copy kernel (bytes per program, warps, streaming cache hints) at the
bench's two sizes, CUDA-graph replays, beside the eager torch copy. Writes ``copy_ceiling.json`` (or
``copy_ceiling_variants.json``): ``python -m bench.probes.copy_ceiling --out DIR [--variants]``
(on a GPU).
"""
from __future__ import annotations

import sys

SIZES_MB = (563, 2250)
# (bytes per program, warps, streaming) of the Triton copy kernel
VARIANTS = ((1 << 15, 8, False), (1 << 15, 8, True), (1 << 16, 16, False), (1 << 16, 16, True))


def variants(sizes: dict) -> list[dict]:
    import numpy as np

    from bench import gpu_ceilings, timing

    rows = []
    for label, nbytes in sizes.items():
        n = gpu_ceilings.copy_bytes(nbytes)
        eager = float(np.median(timing.cuda_events(gpu_ceilings.torch_copy(nbytes), 2)))
        for block, warps, streaming in VARIANTS:
            med = float(np.median(timing.cuda_graph(gpu_ceilings.triton_copy(nbytes, block, warps, streaming), 2)))
            rows.append({"size": label, "bytes": n, "block": block, "warps": warps, "streaming": streaming,
                         "median_ms": med * 1e3, "tbps": 2 * n / med / 1e12, "vs_eager": eager / med})
            print(f"{label:8} block {block:6} warps {warps:2} streaming {streaming!s:5} {med * 1e3:8.4f} ms "
                  f"{2 * n / med / 1e12:6.3f} TB/s, {eager / med:.3f} of eager torch copy_ ({eager * 1e3:.4f} ms)",
                  flush=True)
    return rows


def main(argv=None) -> int:
    import numpy as np
    import torch

    from bench import gpu_ceilings, timing
    from conformance.families.turboquant import cost
    from bench.probes.common import out_dir, shape, write_json

    argv = list(sys.argv[1:] if argv is None else argv)
    only_variants = "--variants" in argv
    argv = [a for a in argv if a != "--variants"]
    folder = out_dir(__doc__.splitlines()[0], argv)
    sizes = {f"L={L}": cost.decode(shape(L)).bytes for L in (8192, 32768)}
    if only_variants:
        write_json(folder / "copy_ceiling_variants.json", {"rows": variants(sizes)})
        return 0
    path = folder / "copy_ceiling.json"
    sizes.update({f"{mb} MB": mb * 1000 * 1000 for mb in SIZES_MB})
    rows = []
    for label, nbytes in sorted(sizes.items(), key=lambda kv: kv[1]):
        n = gpu_ceilings.copy_bytes(nbytes)
        for method, make in (("torch copy_", gpu_ceilings.torch_copy), ("triton copy", gpu_ceilings.triton_copy)):
            fn = make(nbytes)
            for how, timer in (("eager, events", timing.cuda_events), ("cuda-graph", timing.cuda_graph)):
                t = timer(fn, 3)
                med = float(np.median(t))
                rows.append({"size": label, "bytes": n, "method": method, "timing": how, "median_ms": med * 1e3,
                             "min_ms": float(t.min()) * 1e3, "max_ms": float(t.max()) * 1e3,
                             "tbps": 2 * n / med / 1e12})
                print(f"{label:10} {n / 1e6:9.1f} MB {method:12} {how:14} {med * 1e3:8.4f} ms "
                      f"{2 * n / med / 1e12:6.3f} TB/s", flush=True)
            del fn
            torch.cuda.empty_cache()
    write_json(path, {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
