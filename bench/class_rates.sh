#!/usr/bin/env bash
# How well the cost model predicts a measured step at np 1, priced by one speed per device vs by
# per-op-class rates (both from the same hspmd-profile run). Alternates the two cluster files
# per model, REPS rounds; prints each run's predicted-vs-measured error.
#   bench/class_rates.sh [REPS]        (after: cmake --build --preset release)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
out=$(mktemp -d)
export OMPI_MCA_btl_vader_single_copy_mechanism=none OPENBLAS_NUM_THREADS=1
run="mpirun --allow-run-as-root --oversubscribe -np 1"
$run build/release/tools/hspmd-profile --out "$out/rates.json" | tail -4
python3 - "$out" <<'PY'
import json, sys
c = json.load(open(sys.argv[1] + "/rates.json"))
for d in c["devices"]:
    d.pop("rates")
json.dump(c, open(sys.argv[1] + "/speed.json", "w"), indent=1)
PY
declare -A args=(
  [bert]="--layers 2 --hidden 256 --ffn 1024 --heads 4 --seq 64 --vocab 2000"
  [llama]="--layers 2 --hidden 256 --seq 64"
  [vit]="--layers 2 --hidden 256 --ffn 1024 --heads 4"
  [vgg19]="--width 0.25"
  [mlp]=""
)
for m in bert llama vit vgg19 mlp; do
  for r in $(seq "$reps"); do
    for c in speed rates; do
      line=$($run build/release/examples/$m ${args[$m]} --cluster "$out/$c.json" --steps 8 2>&1 |
             grep -o "measured [0-9.]* ms (median), predicted [0-9.]* ms ([+-][0-9]*%)")
      echo "$m $c $line"
    done
  done
done
rm -rf "$out"
