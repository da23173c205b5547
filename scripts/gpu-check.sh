#!/usr/bin/env bash
# On a machine with NVIDIA GPUs: build the GPU suite (release preset), run it, run the NCCL
# collectives sweep on every GPU, and print one summary table to paste into docs/benchmarks.md.
# Where there is no GPU it says so and exits 77 (nothing checked). See docs/gpu.md.
#
#   scripts/gpu-check.sh            # all GPUs of this node
#   MPIRUN_FLAGS=--allow-run-as-root scripts/gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi -L fails); nothing to check"
  exit 77
fi
gpus=$(nvidia-smi -L | wc -l)
echo "gpu-check: $gpus GPU(s):"
nvidia-smi -L | sed 's/^/  /'

declare -a rows
row() { rows+=("$(printf '| %-40s | %-8s | %s |' "$1" "$2" "$3")"); }

if cmake --preset release >/tmp/gpu-check.configure.log 2>&1 &&
   cmake --build --preset release --target gpu.kernels_compile gpu.cuda_backend \
         gpu.nccl_collectives gpu.nccl_distributed hspmd-collectives bert llama vit vgg19 \
         same_losses \
         >/tmp/gpu-check.build.log 2>&1; then
  row "build (release, sm_75/80/90)" "ok" "see /tmp/gpu-check.build.log"
else
  row "build (release, sm_75/80/90)" "FAILED" "see /tmp/gpu-check.*.log"
  printf '%s\n' "${rows[@]}"
  exit 1
fi

status=0
for t in gpu.kernels_compile gpu.cuda_backend gpu.nccl_collectives.np1 \
         gpu.bert.cuda_equals_host gpu.llama.cuda_equals_host gpu.vit.cuda_equals_host \
         gpu.vgg19.cuda_equals_host; do
  start=$(date +%s.%N)
  if ctest --test-dir build/release -R "^${t//./\\.}\$" --output-on-failure \
       >"/tmp/gpu-check.$t.log" 2>&1; then
    result=ok
  else
    result=FAILED
    status=1
  fi
  end=$(date +%s.%N)
  row "$t" "$result" "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f s", b - a }'); /tmp/gpu-check.$t.log"
done

# The distributed executor on every GPU of the node over NCCL, against the host over MPI.
log=/tmp/gpu-check.nccl-distributed.log
if mpirun ${MPIRUN_FLAGS:-} -np "$gpus" build/release/tests/gpu.nccl_distributed >"$log" 2>&1; then
  row "gpu.nccl_distributed, np $gpus" "ok" "$log"
else
  row "gpu.nccl_distributed, np $gpus" "FAILED" "$log"
  status=1
fi

# One BERT-small step on the GPU (f32 and bf16) and on the host (the trainer's median step time).
for run in "cuda f32" "cuda bf16" "host f32"; do
  set -- $run
  log=/tmp/gpu-check.bert-$1-$2.log
  if build/release/examples/bert --device "$1" --precision "$2" --layers 2 --hidden 256 \
       --ffn 3072 --heads 4 --seq 64 --batch 16 --vocab 2000 --steps 10 >"$log" 2>&1; then
    row "bert-small --device $1 --precision $2" "ok" "$(grep -o 'step time measured [0-9.]* ms' "$log")"
  else
    row "bert-small --device $1 --precision $2" "FAILED" "$log"
    status=1
  fi
done

# Gradient buckets overlapping the backward on the communication stream: a traced BERT-small
# run over NCCL on two GPUs; counts the bucket all-reduces (the "collectives in flight" track)
# whose span overlaps the rank's compute spans.
if [ "$gpus" -ge 2 ]; then
  log=/tmp/gpu-check.overlap.log
  trace=/tmp/gpu-check.overlap.json
  if mpirun ${MPIRUN_FLAGS:-} -np 2 build/release/examples/bert --device cuda \
       --cluster clusters/equal-2.json --plan dp-ev --layers 4 --hidden 512 --ffn 2048 --heads 8 \
       --seq 128 --batch 16 --vocab 8000 --steps 6 --trace "$trace" >"$log" 2>&1 &&
     overlap=$(python3 - "$trace" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))
events = events["traceEvents"] if isinstance(events, dict) else events
spans = [e for e in events if e.get("ph") == "X"]
buckets = [e for e in spans if e["tid"] == 2 and e["name"].startswith("all_reduce gradients")]
work = [e for e in spans if e["tid"] == 0 and e.get("cat") == "compute"
        and not e["name"].startswith(("wait", "all_reduce", "idle"))]
def hidden(b):
    return any(w["pid"] == b["pid"] and w["ts"] < b["ts"] + b["dur"] and b["ts"] < w["ts"] + w["dur"]
               for w in work)
n = sum(hidden(b) for b in buckets)
ms = [b["args"].get("device_ms", 0) for b in buckets]
print(f"{n} of {len(buckets)} bucket all-reduces overlap compute; device time {sum(ms):.1f} ms")
PY
     ); then
    row "bucket overlap, bert np 2 --trace" "ok" "$overlap"
  else
    row "bucket overlap, bert np 2 --trace" "FAILED" "$log"
    status=1
  fi
fi

sweep=/tmp/gpu-check.nccl-sweep.txt
if mpirun ${MPIRUN_FLAGS:-} -np "$gpus" build/release/bench/hspmd-collectives --backend nccl \
     -b 1K -e 256M -f 4 -c 1 --algo all >"$sweep" 2>&1 &&
   grep -q "# total #wrong: 0" "$sweep"; then
  row "hspmd-collectives --backend nccl, np $gpus" "ok" "$sweep"
else
  row "hspmd-collectives --backend nccl, np $gpus" "FAILED" "$sweep"
  status=1
fi

echo
echo "| check | result | detail |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "NCCL all_reduce rows (busbw through hspmd vs direct ncclAllReduce):"
grep -E "^ +[0-9]+ .* all_reduce " "$sweep" | tail -4
exit $status
