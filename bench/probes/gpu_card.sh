#!/usr/bin/env bash
# The lab's GPU measurements on a bare GPU machine, from the repository root, in one command of at most TOTAL
# seconds (default 570): the README's offline route (fla-core and its small needs from WHEELS, a folder of
# wheels made by `make peers-carry`, with vLLM's kernel files under WHEELS/vllm-tq; then `make setup-offline`),
# then the STEPS in order, each bounded by what is left, its log in OUT/STEP.txt (the GPU, lscpu and the set-up
# in OUT/machine.txt); a step that cannot start with 40 s left is skipped and said so. Folders the steps write
# are packed into OUT/STEP.tgz.
#   suite  the GDN decode and spec-decode gates (bench.probes.gdn_gpu_suite --steps SUITE_STEPS, default "sm90 spec";
#          "chunked": the chunked prefill whole and by stage beside FLA and vLLM; "kernels": ncu of each kernel
#          of one chunked prefill, ours and FLA's)
#   tq     the TurboQuant decode bench (bench --bench turboquant/decode --device gpu)
#   seg    the chunked prefill's segmented state pass against the serial one (bench.probes.gdn_chunked_segments;
#          SEG_CONFIGS: its configuration names, comma-separated, e.g. "serial,s8 v128 w8"; default all)
#   prep   the chunked prefill's prep kernel variants against the default and FLA (bench.probes.gdn_chunked_prep;
#          PREP_VARIANTS: its variant names, comma-separated; default all)
#   aa     20 A/A pairs of the gated GPU rows (bench --gated-only --aa 20 --write-gates), saved run, noise and
#          gates file under OUT/aa-state (a copy of bench/gates.toml); AA_STATE=DIR continues an earlier one
#   eta    `conform --tier ci --budget ETA_BUDGET (4m30s) --jobs ETA_JOBS (4)`, then its ETA replayed
#   host   the host CPU's GDN decode and prefill builds on cores 0,1 (DEC_LIMIT seconds for the decode)
#   san    compute-sanitizer over our GPU backends' full tier (`make sanitize-gpu`, SAN_JOBS (8) workers;
#          SAN_TOOL, SAN_BACKEND: its tools and backends, default all; SAN_FILTER: a conform --filter without
#          spaces) into SAN_OUT (/tmp/san): the same
#          SAN_OUT on a machine still warm continues the passes cut short; logs and records in OUT/san.tgz
# GPU work runs on cores 2-15, so that host, run last, finds cores 0 and 1 idle.
#   [TOTAL=S] bash bench/probes/gpu_card.sh OUT WHEELS [STEP ...]     (default steps: suite tq seg)
OUT=${1:?usage: gpu_card.sh OUT WHEELS [STEP ...]}
WHEELS=${2:?usage: gpu_card.sh OUT WHEELS [STEP ...]}
shift 2
STEPS=${*:-suite tq seg}
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE PYTHONPATH=$PWD/$WHEELS/vllm-tq
T0=$(date +%s); TOTAL=${TOTAL:-570}
left() { echo $(( TOTAL - ($(date +%s) - T0) )); }
cap() { local l; l=$(left); echo $(( $1 < l - 10 ? $1 : l - 10 )); }   # seconds: at most $1, 10 s kept
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
{ lscpu; python3 -m pip install -q --no-index --find-links "$WHEELS" fla-core einops regex psutil pyzmq; \
  make setup-offline; } >> "$OUT/machine.txt" 2>&1; tail -3 "$OUT/machine.txt"
PY=$PWD/.venv/bin/python
GPU_CORES=2-15
# STEP MODULE CAP NAMES OPTION LINES: python -m MODULE --out /tmp/STEP --budget (at most CAP s, 20 kept) [OPTION
# NAME...] (NAMES comma-separated; none: the module's default) into $log, /tmp/STEP packed, $log's last LINES shown
budgeted() {
  local B names=() extra=()
  B=$(( $(cap "$3") - 20 ))
  [ -n "$4" ] && IFS=, read -ra names <<< "$4" && extra=("$5" "${names[@]}")
  timeout "$(( B + 20 ))" taskset -c $GPU_CORES $PY -m "$2" --out "/tmp/$1" --budget "$B" "${extra[@]}" > "$log" 2>&1
  tar czf "$OUT/$1.tgz" -C /tmp "$1" 2>/dev/null; tail -"$6" "$log"
}
echo "setup done at $(( $(date +%s) - T0 )) s; steps: $STEPS"
for s in $STEPS; do
  L=$(left)
  if [ "$L" -lt 40 ]; then echo "== $s skipped: $L s left"; continue; fi
  echo "== $s ($L s left, $(date -u +%T) UTC)"
  log="$OUT/$s.txt"
  case $s in
    suite)
      timeout "$(cap 290)" taskset -c $GPU_CORES $PY -m bench.probes.gdn_gpu_suite --out /tmp/suite --steps ${SUITE_STEPS:-sm90 spec} \
        --budget "$(( $(cap 290) - 10 ))" --commit "$(git rev-parse --short HEAD 2>/dev/null)" > "$log" 2>&1
      tar czf "$OUT/suite.tgz" -C /tmp suite 2>/dev/null; tail -30 "$log";;
    tq)
      timeout "$(cap 190)" taskset -c $GPU_CORES $PY -m bench --bench turboquant/decode --device gpu \
        --out /tmp/tq/perf.json --no-remeasure > "$log" 2>&1
      tar czf "$OUT/tq.tgz" -C /tmp tq 2>/dev/null; tail -40 "$log";;
    seg) budgeted seg bench.probes.gdn_chunked_segments 400 "${SEG_CONFIGS:-}" --configs 45;;
    prep) budgeted prep bench.probes.gdn_chunked_prep 300 "${PREP_VARIANTS:-}" --variants 30;;
    aa)
      state=${AA_STATE:-$OUT/aa-state}; mkdir -p "$state"; cp -n bench/gates.toml "$state/gates.toml"
      timeout "$(cap 100000)" taskset -c $GPU_CORES $PY -m bench --device gpu --gated-only --aa 20 --write-gates \
        --baselines "$state" --gates "$state/gates.toml" --load "idle host, nothing else running" > "$log" 2>&1
      echo "aa rc $?"; tar czf "$OUT/aa.tgz" -C "$(dirname "$state")" "$(basename "$state")"; tail -25 "$log";;
    eta)
      timeout "$(cap 330)" taskset -c $GPU_CORES $PY -m kernel_lab conform --tier ci --budget "${ETA_BUDGET:-4m30s}" \
        --jobs "${ETA_JOBS:-4}" --out /tmp/eta > "$log" 2>&1
      echo "conform rc $?"; $PY -m conformance.run.eta_replay /tmp/eta --every 20 >> "$log" 2>&1
      tar czf "$OUT/eta.tgz" -C /tmp eta/run.json eta/cells.jsonl eta/summary.md 2>/dev/null; tail -30 "$log";;
    host)
      timeout "$(cap 100000)" bash -c "taskset -c 0,1 $PY -m bench.probes.gdn_cpu_decode_builds --run ours=. \
        --cpus 0,1 --budget ${DEC_LIMIT:-200} --out /tmp/host/decode; taskset -c 0,1 $PY -m \
        bench.probes.gdn_prefill_builds --build ours=. --cpus 0,1 --rounds 2 --reps 5 --out /tmp/host/prefill" \
        > "$log" 2>&1
      tar czf "$OUT/host.tgz" -C /tmp host 2>/dev/null; tail -30 "$log";;
    san)
      d=${SAN_OUT:-/tmp/san}; tl=$(( $(cap 100000) - 40 ))   # 40 s kept: an interrupted pass may take 30 s to stop
      if [ "$tl" -lt 20 ]; then echo "== san skipped: $L s left"; continue; fi
      taskset -c $GPU_CORES make sanitize-gpu SAN_GPU_OUT="$d" SAN_GPU_TIME_LIMIT="$tl" SAN_GPU_TOOL="${SAN_TOOL:-}" \
        SAN_GPU_BACKEND="${SAN_BACKEND:-}" SAN_GPU_CONFORM="--jobs ${SAN_JOBS:-8}${SAN_FILTER:+ --filter $SAN_FILTER}" \
        > "$log" 2>&1
      echo "sanitize rc $?"; tar czf "$OUT/san.tgz" -C "$(dirname "$d")" "$(basename "$d")"; tail -25 "$log";;
    *) echo "unknown step $s (expected suite, tq, seg, aa, eta, host, san)";;
  esac
done
echo "done at $(( $(date +%s) - T0 )) s"
