#!/usr/bin/env bash
# Compile cost of a translation unit that uses hspmd, as a user's trainer pays it: CPU seconds
# (user + system) and peak memory of g++ at -O2, and of -fsyntax-only (parsing and templates,
# no code generation). Flags are the ones hspmd::hspmd gives a consumer (BLAS, MPI).
#   bench/compile_cost.sh [SOURCE.cpp] [REPEATS]     (default examples/custom_trainer.cpp, 3)
#   HSPMD_INCLUDE=/other/include bench/compile_cost.sh ...   (e.g. an older checkout's headers)
#   HSPMD_COMPILED=1 bench/compile_cost.sh ...   (compiled mode: the trainer from hspmd::compiled)
# Prints the median of REPEATS runs for each mode.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-examples/custom_trainer.cpp}
repeats=${2:-3}
include=${HSPMD_INCLUDE:-include}
cxx=${CXX:-g++}
flags=(-std=c++20 -DHSPMD_HAS_BLAS -DHSPMD_HAS_MPI -DOMPI_SKIP_MPICXX -I"$include"
       -isystem /usr/include/x86_64-linux-gnu/openblas-pthread
       $(mpicxx --showme:compile))
[[ -n "${HSPMD_COMPILED:-}" ]] && flags+=(-DHSPMD_COMPILED)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
for mode in "-O2 -c -o $out/o" "-fsyntax-only"; do
  cpu=(); mem=()
  for ((i = 0; i < repeats; i++)); do
    # shellcheck disable=SC2086
    /usr/bin/time -f "%U %S %M" -o "$out/t" "$cxx" "${flags[@]}" $mode "$src"
    read -r user sys kib < <(tail -1 "$out/t")
    cpu+=("$(awk -v u="$user" -v s="$sys" 'BEGIN {print u + s}')")
    mem+=("$((kib / 1024))")
  done
  mode=${mode%% -o *}
  printf '%-40s %-14s CPU %6.1f s   peak %5d MB   (median of %d)\n' "$src${HSPMD_COMPILED:+ (compiled mode)}" "$mode" \
    "$(printf '%s\n' "${cpu[@]}" | median)" "$(printf '%s\n' "${mem[@]}" | median)" "$repeats"
done
