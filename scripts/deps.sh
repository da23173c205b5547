#!/usr/bin/env bash
# Makes sure the Debian packages hspmd builds and tests with are installed.
# As root, installs the missing ones with apt-get (after one `apt-get update`); otherwise prints
# the exact command to run and exits non-zero. Fast when nothing is missing (one dpkg-query).
# Usage: scripts/deps.sh [--check]   (--check: never install, only report)
set -euo pipefail

packages=(
  cmake ninja-build g++ make        # toolchain
  libopenmpi-dev openmpi-bin        # MPI backend and mpirun
  nlohmann-json3-dev                # cluster files, plans, traces
  libcli11-dev                      # command-line flags of examples and tools
  catch2                            # unit and MPI tests (Catch2 2.13)
  libbenchmark-dev                  # micro-benchmarks under bench/
  libglpk-dev                       # test-only reference for the LP solver
  libopenblas-dev                   # host GEMM (cblas) for the kernels
  clang-14 libclang-rt-14-dev       # libFuzzer for the cluster reader's fuzz test
  python3-numpy                     # an independent reader of exported checkpoints (a test)
  librsvg2-bin                      # rsvg-convert: the plan pictures render (a test)
)

missing=()
for pkg in "${packages[@]}"; do
  # Unknown and half-removed packages count as missing too.
  dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null | grep -qx installed || missing+=("$pkg")
done

[[ ${#missing[@]} -eq 0 ]] && exit 0

line="apt-get install -y --no-install-recommends ${missing[*]}"
if [[ "${1-}" == "--check" || "$(id -u)" -ne 0 ]]; then
  echo "hspmd: missing Debian packages: ${missing[*]}" >&2
  echo "hspmd: install them with:  sudo apt-get update && sudo $line" >&2
  exit 1
fi

echo "hspmd: installing missing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
$line
