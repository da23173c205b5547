#!/usr/bin/env bash
# Runs the test suite with other busy processes beside it the whole time, as on a user's machine
# that is not idle: no test may depend on measured time, and timeouts must leave room.
#
#   scripts/test-under-load.sh            # ctest --preset dev on the existing dev build
#   scripts/test-under-load.sh --fresh    # a fresh clone of HEAD, `make test` there (build too)
#   BUSY=3 scripts/test-under-load.sh     # how many busy processes (default 2)
#   scripts/test-under-load.sh -- -R unit # extra ctest arguments (not with --fresh)
#
# Each busy process spins on a core (a shell loop) for the whole run. Prints the suite's result
# and its wall time; exits with the suite's status.
set -euo pipefail
cd "$(dirname "$0")/.."
busy=${BUSY:-2}
fresh=0
if [[ "${1-}" == "--fresh" ]]; then
  fresh=1
  shift
fi
[[ "${1-}" == "--" ]] && shift

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [[ -n "${tmp-}" ]]; then rm -rf "$tmp"; fi
  return 0
}
trap cleanup EXIT
for ((i = 0; i < busy; i++)); do
  bash -c 'while :; do :; done' &
  pids+=($!)
done
echo "test-under-load: $busy busy process(es) running beside the suite (load $(cut -d' ' -f1 /proc/loadavg))"

start=$(date +%s)
status=0
if ((fresh)); then
  tmp=$(mktemp -d)
  git clone -q . "$tmp/hspmd"
  (cd "$tmp/hspmd" && make test) || status=$?
else
  [[ -f build/dev/CTestTestfile.cmake ]] || { echo "no dev build: run make test once, or --fresh" >&2; exit 2; }
  ctest --preset dev "$@" || status=$?
fi
end=$(date +%s)
echo "test-under-load: suite exit $status after $((end - start)) s with $busy busy process(es) beside it"
exit "$status"
