#!/usr/bin/env bash
# The GPU chunked prefill in one device call (under 5 minutes), from the repository root:
#   1. the ci tier's chunked cells on triton-gdn (records under OUT/ci; every record that did not pass printed);
#   2. the CUDA-graph replay test (tests/unit/test_triton_gdn_chunked_gpu.py) where pytest is installed;
#   3. bench.probes.gdn_chunked_variants (ours by readout mode and stage, the state pass's configurations,
#      BASELINE, another gdn_chunked.py, and FLA; the table printed last), or with PROBE=prep
#      bench.probes.gdn_chunked_prep (the prep kernel's variants against the default and FLA; BASELINE unused),
#      or with PROBE=state bench.probes.gdn_chunked_state (the state pass against BASELINE's, bit for bit and
#      timed, FLA beside them; then ncu of both state passes at 1x8192 and 4x2048), or with PROBE=segments
#      bench.probes.gdn_chunked_segments (the segmented state pass's configurations against the serial path and
#      timed, each in its own process; BASELINE unused).
# Each step is bounded by a timeout; a failure is printed whole and the next step runs.
#   [PROBE=prep|state|segments] bash bench/probes/gdn_chunked_device.sh OUT [BASELINE] [WHEELS]   (WHEELS: a folder holding
#   fla-core's wheel)
OUT=${1:?usage: gdn_chunked_device.sh OUT [BASELINE] [WHEELS]}
BASELINE=${2:-}
WHEELS=${3:-}
export PYTHONPATH=$PWD
mkdir -p "$OUT"
if [ -n "$WHEELS" ]; then
  timeout 30 python3 -m pip install -q --no-index --find-links "$WHEELS" fla-core einops regex psutil pyzmq 2>&1 \
    | tail -5 || echo "pip install failed"
fi
echo "== 1. ci chunked cells on triton-gdn"
timeout 65 python3 -m kernel_lab conform --tier ci --family gdn --op chunked --backend triton-gdn --jobs 6 \
  --out "$OUT/ci" 2>&1 | tail -6 || echo "conform stopped or failed (rc ${PIPESTATUS[0]})"
python3 - "$OUT/ci/cells.jsonl" <<'EOF' || echo "no records to read"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
bad = [r for r in rows if r.get("status") != "pass"]
print(f"{len(rows)} records, {len(rows) - len(bad)} pass")
for r in bad:
    print(r.get("id"), r.get("status"), str(r.get("reason"))[:600])
EOF
echo "== 2. CUDA-graph replay"
if python3 -c "import pytest" 2>/dev/null; then
  timeout 30 python3 -m pytest -q -p no:cacheprovider tests/unit/test_triton_gdn_chunked_gpu.py 2>&1 | tail -15 \
    || echo "pytest stopped or failed"
else
  echo "pytest is not installed: skipped"
fi
echo "== 3. timings"
if [ "${PROBE:-variants}" = state ]; then
  timeout -s TERM 90 python3 -m bench.probes.gdn_chunked_state --out "$OUT" --baseline "$BASELINE" 2>&1 \
    || echo "the timing probe stopped or failed"
  echo "== 4. ncu of the state passes"
  timeout 70 python3 -m bench.probes.gdn_chunked_state --out "$OUT" --baseline "$BASELINE" --ncu 2>&1 \
    || echo "ncu stopped or failed"
elif [ "${PROBE:-variants}" = segments ]; then
  timeout -s TERM 170 python3 -m bench.probes.gdn_chunked_segments --out "$OUT" --budget 150 2>&1 \
    || echo "the timing probe stopped or failed"
elif [ "${PROBE:-variants}" = prep ]; then
  timeout -s TERM 170 python3 -m bench.probes.gdn_chunked_prep --out "$OUT" --budget 150 2>&1 \
    || echo "the timing probe stopped or failed"
else
  timeout -s TERM 140 python3 -m bench.probes.gdn_chunked_variants --out "$OUT" ${BASELINE:+--baseline "$BASELINE"} \
    2>&1 || echo "the timing probe stopped or failed"
fi
