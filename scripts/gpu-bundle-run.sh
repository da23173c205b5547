#!/usr/bin/env bash
# The GPU bundle's run script (scripts/gpu-bundle.sh copies it into the bundle as run.sh). Runs
# every check of the first GPU run from the bundle's folder within a budget (BUNDLE_BUDGET_S,
# default 450 s) and writes summary.md (one table) and logs.tar.gz to $OUT (default
# <bundle>/out). Needs no installation: the bundle's lib/ and ompi/ give Open MPI and OpenBLAS;
# CUDA, cuBLAS and NCCL come from the machine (its toolkit, or the NVIDIA wheels beside its
# PyTorch). Where no GPU is usable every GPU part says "skipped" and the host parts still run.
#
#   OUT=/tmp/gpu-out ./run.sh            # all checks
#   BUNDLE_ONLY="gemm collectives" ./run.sh   # only the checks whose names contain a word
set -uo pipefail
B=$(cd "$(dirname "$0")" && pwd)
if [ -f "$B/payload.tar.xz" ]; then # the bundle as it travels: unpack, run the unpacked copy
  dest=${BUNDLE_DIR:-$(mktemp -d /tmp/hspmd-bundle.XXXXXX)}
  mkdir -p "$dest"
  if command -v xz >/dev/null; then
    xz -dc "$B/payload.tar.xz" | tar -C "$dest" -xf -
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$B/payload.tar.xz" "$dest"
  fi || { echo "run.sh: cannot unpack $B/payload.tar.xz into $dest (needs xz or python3)" >&2; exit 1; }
  "$dest/run.sh" "$@"
  rc=$?
  [ -z "${BUNDLE_DIR:-}" ] && rm -rf "$dest"
  exit $rc
fi
OUT=${OUT:-$B/out}
mkdir -p "$OUT"
logs=$(mktemp -d)
summary=$OUT/summary.md
budget=${BUNDLE_BUDGET_S:-450}
t_start=$(date +%s)
rows=()

# ---- libraries: ours from the bundle, CUDA's from the machine --------------------------------
need=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2)
candidates=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib
            /usr/lib/x86_64-linux-gnu /usr/lib64)
[ -n "${CUDA_HOME:-}" ] && candidates=("$CUDA_HOME/lib64" "$CUDA_HOME/lib" "${candidates[@]}")
if command -v python3 >/dev/null; then
  # NVIDIA's wheels beside PyTorch (nvidia/<part>/lib, nvidia/cu13/lib)
  while read -r d; do candidates+=("$d"); done < <(python3 - 2>/dev/null <<'PY'
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
seen = []
for r in roots:
    for d in glob.glob(os.path.join(r, "nvidia", "*", "lib")):
        if d not in seen:
            seen.append(d)
            print(d)
PY
)
fi
cuda_path=""
missing=()
for lib in "${need[@]}"; do
  found=""
  for d in "${candidates[@]}"; do
    if [ -e "$d/$lib" ]; then found=$d; break; fi
  done
  if [ -n "$found" ]; then
    [[ ":$cuda_path:" == *":$found:"* ]] || cuda_path=${cuda_path:+$cuda_path:}$found
  else
    missing+=("$lib")
  fi
done
export LD_LIBRARY_PATH=$B/lib${cuda_path:+:$cuda_path}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OPAL_PREFIX=$B/ompi PMIX_PREFIX=$B/pmix PMIX_LIBDIR=$B/pmix/lib
export PMIX_MCA_mca_base_component_path=$B/pmix/lib/pmix
export PATH=$B/ompi/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_plm=isolated                         # one node, no ssh
export OMPI_MCA_btl_vader_single_copy_mechanism=none # no ptrace (CMA) in a micro-VM
export OMPI_MCA_rmaps_base_oversubscribe=1
mpirun=(mpirun --oversubscribe --bind-to none)

row() { rows+=("$(printf '| %s | %s | %s | %s |' "$1" "$2" "$3" "$4")"); }
elapsed() { echo $(($(date +%s) - t_start)); }
wanted() { # BUNDLE_ONLY: run only the checks whose name holds one of its words
  [ -z "${BUNDLE_ONLY:-}" ] && return 0
  local w
  for w in $BUNDLE_ONLY; do [[ $1 == *"$w"* ]] && return 0; done
  return 1
}
no_gpu='no usable device|cudaGetDeviceCount|no usable GPU|no CUDA device|CUDA driver version is insufficient|exit 77'

# check NAME TIMEOUT_S DETAIL_FN -- command...: runs it (its output in logs/NAME.log) within the
# time left; the row says ok, FAILED, TIMEOUT, skipped (exit 77, or CUDA finds no device) or
# "not run" (out of budget); DETAIL_FN (or -) prints the row's detail from the log.
check() {
  local name=$1 limit=$2 detail=$3
  shift 4
  wanted "$name" || return 0
  local left=$((budget - $(elapsed)))
  if [ $left -lt 15 ]; then
    row "$name" "not run" "-" "the bundle's ${budget} s budget was spent"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local log=$logs/$name.log t0=$(date +%s.%N) rc result
  # (through bash -c, so that a check may be one of the functions exported below)
  timeout --kill-after=10 "$limit" bash -c '"$@"' bash "$@" >"$log" 2>&1
  rc=$?
  local secs
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }')
  if [ $rc = 0 ]; then
    result=ok
  elif [ $rc = 124 ] || [ $rc = 137 ]; then
    result=TIMEOUT
  elif [ $rc = 77 ] || grep -Eq "$no_gpu" "$log"; then
    result=skipped
  else
    result=FAILED
  fi
  local text="log $name.log"
  if [ "$detail" != - ] && [ $result = ok ]; then text=$($detail "$log" | tr '\n' ' '); fi
  [ $result = FAILED ] && text="exit $rc: $(grep -v '^\s*$' "$log" | tail -2 | cut -c1-160 | tr '\n' ' ' | sed 's/|/\//g')"
  row "$name" "$result" "$secs" "$text"
}

# ---- the machine ------------------------------------------------------------------------------
{
  echo "bundle: $(cat "$B/COMMIT" 2>/dev/null | tr '\n' ' ')"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "host: $(uname -srm), $(nproc) cores"
  grep -m1 'model name' /proc/cpuinfo 2>/dev/null
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1
  else
    echo "nvidia-smi: not found"
  fi
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for f in "$B"/build/*/*; do
    if ldd "$f" 2>&1 | grep -q "not found"; then
      echo "MISSING for $(basename "$f"): $(ldd "$f" | grep 'not found' | awk '{print $1}' | tr '\n' ' ')"
    fi
  done
  echo "BLAS: $(OPENBLAS_VERBOSE=2 "$B/build/examples/bert" --steps 1 --layers 1 --hidden 16 --heads 2 --seq 8 --vocab 32 --batch 2 2>&1 | grep -E '^BLAS|Core:' | head -2 | tr '\n' ' ')"
} >"$logs/machine.log" 2>&1
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
if [ ${#missing[@]} -gt 0 ]; then
  row "libraries" "FAILED" "-" "not found on this machine: ${missing[*]} (searched ${candidates[*]})"
elif grep -q '^MISSING' "$logs/machine.log"; then
  row "libraries" "FAILED" "-" "$(grep '^MISSING' "$logs/machine.log" | head -2 | tr '\n' ' ')"
else
  row "libraries" "ok" "-" "CUDA's from ${cuda_path:-?}"
fi

# ---- correctness ------------------------------------------------------------------------------
coll_detail() { grep -Eo '# Avg bus bandwidth.*|# total #wrong: [0-9]+' "$1" | tr '\n' ' '; }
catch_detail() { grep -Eo 'All tests passed.*|test cases:.*|op-by-op .*|passed \(.*' "$1" | tr '\n' ' '; }
check gpu.kernels_compile 60 - -- "$B/build/tests/gpu.kernels_compile"
check gpu.cuda_backend 180 catch_detail -- "$B/build/tests/gpu.cuda_backend"

# every example model: --device cuda losses equal the host run's to 1e-4, and the device
# allocator's reserved bytes flat after step 2 (same_losses checks both)
models=(
  "bert --layers 1 --hidden 16 --ffn 32 --heads 2 --seq 8 --vocab 32 --steps 5 --accumulate 2"
  "llama --layers 1 --hidden 16 --ffn 24 --heads 2 --seq 8 --vocab 32 --steps 5"
  "vit --image 8 --layers 1 --hidden 16 --ffn 32 --heads 2 --steps 5"
  "vgg19 --width 0.0625 --fc 16 --steps 3 --batch 2")
equal_runs() { # model args...
  local m=$1 dir
  shift
  dir=$(mktemp -d)
  "$B/build/examples/$m" "$@" --device host --metrics "$dir/host.jsonl" &&
    "$B/build/examples/$m" "$@" --device cuda --metrics "$dir/cuda.jsonl" &&
    "$B/build/tests/same_losses" "$dir/host.jsonl" "$dir/cuda.jsonl" 1e-4 &&
    cp "$dir/cuda.jsonl" "$logs/$m.cuda.jsonl"
}
same_detail() { grep -Eo 'same_losses:.*|[0-9]+ steps? .*equal.*' "$1" | tail -1; }
export -f equal_runs
export B logs
for run in "${models[@]}"; do
  set -- $run
  check "$1.cuda_equals_host" 90 same_detail -- equal_runs "$@"
done

# the bundle's Open MPI itself: two host ranks, shared memory
check mpi.host.np2 60 coll_detail -- "${mpirun[@]}" -np 2 "$B/build/bench/hspmd-collectives" \
  --backend mpi -b 1K -e 1M -f 4 -c 1
check gpu.nccl_collectives.np1 90 catch_detail -- "${mpirun[@]}" -np 1 "$B/build/tests/gpu.nccl_collectives"
check gpu.nccl_distributed.np1 180 catch_detail -- "${mpirun[@]}" -np 1 "$B/build/tests/gpu.nccl_distributed"

# ---- speed ------------------------------------------------------------------------------------
step_detail() { grep -Eo 'step time measured [0-9.]+ ms.*|on cuda:[0-9]+ \([^)]*\)' "$1" | head -2; }
small_model="--layers 2 --hidden 256 --ffn 3072 --heads 4 --seq 64 --batch 16 --vocab 2000"
small="$small_model --steps 10"
check bert-small.cuda.f32 60 step_detail -- "$B/build/examples/bert" $small --device cuda --precision f32
check bert-small.cuda.bf16 60 step_detail -- "$B/build/examples/bert" $small --device cuda --precision bf16
check bert-small.host.f32 90 step_detail -- "$B/build/examples/bert" $small --device host
# a traced run (one rank under mpirun, the distributed engine over NCCL on a one-GPU cluster):
# every compute span of the device carries its event-timed device_ms
cat >"$logs/one-gpu.json" <<'JSON'
{ "version": 1, "name": "one-gpu", "description": "the GPU bundle's one GPU",
  "links": { "intra_node": { "bandwidth": 4e11, "latency": 5e-6 } },
  "devices": [ { "name": "gpu0", "kind": "gpu", "speed": 5e13, "memory": "64 GiB", "node": 0 } ] }
JSON
trace_spans() {
  mpirun --oversubscribe --bind-to none -np 1 "$B/build/examples/bert" $small_model --steps 4 \
    --device cuda --cluster "$logs/one-gpu.json" --trace "$logs/bert-small.trace.json" &&
    python3 - "$logs/bert-small.trace.json" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
spans = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "compute"
         and e["name"].startswith(("forward", "backward"))]
timed = [e for e in spans if "device_ms" in e.get("args", {})]
dev = sum(e["args"]["device_ms"] for e in timed)
host = sum(e["dur"] for e in timed) / 1e3
other = sorted({e["name"] for e in ev if e.get("ph") == "X" and e.get("cat") == "compute"
                and e not in spans and "device_ms" not in e.get("args", {})})
print(f"{len(timed)} of {len(spans)} node spans carry device_ms; device {dev:.1f} ms, host "
      f"{host:.1f} ms; spans without: {', '.join(other) or 'none'}")
sys.exit(0 if spans and len(timed) == len(spans) else 1)
PY
}
export -f trace_spans
export small_model
trace_detail() { grep -E 'node spans' "$1" | tail -1; }
check bert-small.cuda.np1.trace 60 trace_detail -- trace_spans

gemm_detail() { awk '$NF ~ /^[0-9.]+$/ && NF > 4 { n++; r = $NF; if (min == "" || r < min) min = r; s += r }
                     END { if (n) printf "%d shapes x 2 types; direct/backend ratio min %.3f, mean %.3f", n, min, s / n }' "$1"; }
check gemm.backend_vs_cublas 90 gemm_detail -- "$B/build/bench/hspmd-gpu-gemm" 20
check hspmd-collectives.nccl.np1 90 coll_detail -- "${mpirun[@]}" -np 1 "$B/build/bench/hspmd-collectives" \
  --backend nccl -b 1K -e 256M -f 4 -c 1 --algo all

# BERT-base on one GPU: step time and MFU, then beside PyTorch eager (same shapes, precision)
base="--layers 12 --hidden 768 --heads 12 --ffn 3072 --seq 128 --batch 32 --vocab 30522 --steps 12"
# matmul FLOPs of one step (forward x 3): projections, FFN, attention's two products, the head
flops=$(awk 'BEGIN { B = 32; S = 128; h = 768; f = 3072; V = 30522; L = 12; T = B * S;
                     fw = L * (2 * T * h * h * 4 + 2 * T * h * f * 2 + 2 * 2 * B * S * S * h) + 2 * T * h * V;
                     printf "%.0f", 3 * fw }')
case $gpu_name in
  *H100*PCIe*) peak_bf16=756e12; peak_f32=51e12 ;;
  *H100* | *H200* | *H800* | *H20*) peak_bf16=989e12; peak_f32=67e12 ;;
  *A100*) peak_bf16=312e12; peak_f32=19.5e12 ;;
  *) peak_bf16=0; peak_f32=0 ;;
esac
mfu_detail() { # log precision
  local ms peak
  ms=$(grep -Eo 'step time measured [0-9.]+ ms' "$1" | grep -Eo '[0-9.]+' | head -1)
  peak=$peak_f32
  [[ $1 == *bf16* ]] && peak=$peak_bf16
  awk -v ms="${ms:-0}" -v fl="$flops" -v pk="$peak" 'BEGIN {
    if (ms <= 0) { print "no step time"; exit }
    printf "%.1f ms/step, %.1f TFLOP/s", ms, fl / (ms / 1e3) / 1e12
    if (pk > 0) printf ", MFU %.1f%% of %.0f TFLOP/s (datasheet, dense)", 100 * fl / (ms / 1e3) / pk, pk / 1e12 }'
}
check bert-base.cuda.f32 120 mfu_detail -- "$B/build/examples/bert" $base --device cuda --precision f32
check bert-base.cuda.bf16 120 mfu_detail -- "$B/build/examples/bert" $base --device cuda --precision bf16
torch_detail() { grep -E 'hspmd / pytorch' "$1" | sed 's/^ *//' | tail -1; }
if command -v python3 >/dev/null && python3 -c 'import torch' 2>/dev/null; then
  for p in bf16 f32; do
    check "bert-base.vs_pytorch.$p" 200 torch_detail -- python3 "$B/bench/vs_pytorch.py" --build "$B/build" \
      --only gpu-bert-base --precision "$p" --rounds 3 --steps 8
  done
else
  row "bert-base.vs_pytorch" "skipped" "-" "no python3 with torch here"
fi

# where BERT-base's device time goes: a traced np 1 run, its nodes by device time
base_trace() {
  mpirun --oversubscribe --bind-to none -np 1 "$B/build/examples/bert" ${base/--steps 12/--steps 3} \
    --device cuda --cluster "$logs/one-gpu.json" --trace "$logs/bert-base.trace.json" &&
    python3 - "$logs/bert-base.trace.json" <<'PY'
import collections, json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
by_op = collections.defaultdict(lambda: [0, 0.0])
total = 0.0
for e in ev:
    a = e.get("args", {})
    if e.get("ph") == "X" and "device_ms" in a and "op" in a:
        k = by_op[(a.get("pass", "?"), a["op"])]
        k[0] += 1
        k[1] += a["device_ms"]
        total += a["device_ms"]
print(f"device time of the node spans over 3 steps: {total:.1f} ms")
for (p, op), (n, ms) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:15]:
    print(f"  {p:8s} {op:24s} {n:5d} spans {ms:9.1f} ms {100 * ms / total:5.1f}%")
PY
}
export -f base_trace
export base
base_trace_detail() { grep -E 'device time of the node spans' "$1"; }
check bert-base.cuda.np1.trace 90 base_trace_detail -- base_trace

# ---- the table --------------------------------------------------------------------------------
{
  echo "# GPU bundle run: ${gpu_name:-no GPU}"
  echo
  sed 's/^/    /' "$logs/machine.log"
  echo
  echo "| check | result | time | detail |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "total $(elapsed) s of a ${budget} s budget"
  echo
  for f in "$logs"/gemm.backend_vs_cublas.log "$logs"/hspmd-collectives.nccl.np1.log \
           "$logs"/bert-base.vs_pytorch.*.log "$logs"/bert-base.cuda.np1.trace.log; do
    [ -f "$f" ] || continue
    echo "## $(basename "$f" .log)"
    echo '```'
    grep -Ev '^\s*$' "$f" | tail -25
    echo '```'
  done
} >"$summary"
tar -C "$logs" -czf "$OUT/logs.tar.gz" .
rm -rf "$logs"
cat "$summary"
grep -Eq '\| (FAILED|TIMEOUT) ' "$summary" && exit 1
exit 0
