#!/usr/bin/env bash
# Builds what the first GPU run needs and gathers it into one folder that runs on a bare GPU
# machine: CUDA, cuBLAS and NCCL there, but no Open MPI, no OpenBLAS and nothing to install
# (docs/gpu.md, "The GPU bundle"). Needs no GPU itself.
#
#   scripts/gpu-bundle.sh               # build (release, sm_80 + sm_90) and gather
#   scripts/gpu-bundle.sh --no-build    # gather what build/gpu-bundle already holds
#   scripts/gpu-bundle.sh --check       # ... then run the bundle here from its folder, in a clean
#                                       # environment (env -i) with this machine's Open MPI,
#                                       # OpenBLAS and their libraries hidden: host parts must
#                                       # pass, GPU parts must say skipped
#
# The folder (build/gpu-bundle/bundle, at most 60 MiB) holds run.sh (scripts/gpu-bundle-run.sh)
# and payload.tar.xz, which run.sh unpacks (to a temporary folder) and runs: the binaries under
# build/ (as in a build tree), the shared libraries they need that such a machine lacks under
# lib/, Open MPI's launcher, plugins and help files under ompi/ (found there through
# OPAL_PREFIX), PMIx's plugins under pmix/, the cluster files, bench/vs_pytorch.py and run.sh
# again. It runs every check within 8 minutes and writes summary.md and logs to $OUT.
# (Compressed because OpenBLAS alone is 35 MiB and each example model carries the GPU engine's
# device code for two architectures: ~96 MiB unpacked, ~15 MiB packed.)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=$root/build/gpu-bundle
bundle=$build/bundle
tree=$build/bundle-tree
limit_mib=60

build_it=1
check=0
for a in "$@"; do
  case $a in
    --no-build) build_it=0 ;;
    --check) check=1 ;;
    *) echo "gpu-bundle.sh: unknown argument '$a' (use --no-build, --check)" >&2; exit 2 ;;
  esac
done

command -v nvcc >/dev/null || { echo "gpu-bundle.sh: no nvcc on PATH (the CUDA toolkit builds the GPU parts)" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "gpu-bundle.sh: no mpirun (scripts/deps.sh installs Open MPI)" >&2; exit 1; }

targets=(gpu.kernels_compile gpu.cuda_backend gpu.nccl_collectives gpu.nccl_distributed
         hspmd-collectives hspmd-gpu-gemm bert llama vit vgg19 same_losses)
if [ $build_it = 1 ]; then
  # Release, generic x86-64 (the GPU machine's CPU is not this one), device code for sm_80
  # (A100) and sm_90 (H100/H200).
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHSPMD_NATIVE_ARCH=OFF \
    "-DHSPMD_CUDA_ARCHITECTURES=80;90" -DHSPMD_BUILD_MICROBENCH=ON \
    "-DMPIEXEC_PREFLAGS=--oversubscribe;--allow-run-as-root" >/dev/null
  ninja -C "$build" "${targets[@]}"
fi

rm -rf "$tree"
mkdir -p "$tree"/{build/examples,build/tests,build/bench,lib,bench,clusters}
install_bin() { # build-tree path -> the same path under bundle/build, stripped of host symbols
  mkdir -p "$(dirname "$tree/build/$1")"
  cp "$build/$1" "$tree/build/$1"
  strip --strip-unneeded "$tree/build/$1"
}
for t in gpu.kernels_compile gpu.cuda_backend gpu.nccl_collectives gpu.nccl_distributed same_losses; do
  install_bin "tests/$t"
done
install_bin bench/hspmd-collectives
install_bin bench/hspmd-gpu-gemm
for m in bert llama vit vgg19; do install_bin "examples/$m"; done

# Open MPI: the launcher and daemon, the help texts, and the plugins that need nothing a plain
# machine lacks (no UCX, libfabric, verbs, PSM: one node, shared memory and TCP).
ompi_libdir=$(ompi_info --path libdir --parsable | sed 's/.*://')
ompi_pkglibdir=$(ompi_info --path pkglibdir --parsable | sed 's/.*://')
ompi_prefix=$(ompi_info --path prefix --parsable | sed 's/.*://')
ompi_datadir=$(ompi_info --path pkgdatadir --parsable | sed 's/.*://')
rel_pkglib=${ompi_pkglibdir#"$ompi_prefix"/}
rel_lib=${ompi_libdir#"$ompi_prefix"/}
mkdir -p "$tree/ompi/bin" "$tree/ompi/$rel_pkglib" "$tree/ompi/share/openmpi"
cp -L "$(command -v orterun || command -v mpirun)" "$tree/ompi/bin/mpirun"
cp -L "$(command -v orted)" "$tree/ompi/bin/orted"
cp "$ompi_datadir"/*.txt "$tree/ompi/share/openmpi/"
unwanted='libuc[pstm]\.|libfabric|libibverbs|librdmacm|libpsm|libinfinipath|libefa|libnl-|libcuda\.|libjvm|libjava|liboshmem'
plugins=()
for p in "$ompi_pkglibdir"/*.so; do
  if ldd "$p" | grep -Eq "$unwanted"; then continue; fi
  cp "$p" "$tree/ompi/$rel_pkglib/"
  plugins+=("$p")
done
# PMIx (Open MPI's process-management library) and its plugins, found through PMIX_PREFIX.
pmix_lib=$(ldd "$ompi_pkglibdir/mca_pmix_ext3x.so" 2>/dev/null | awk '/libpmix/{print $3}')
pmix_plugins=()
if [ -n "$pmix_lib" ]; then
  pmix_libdir=$(dirname "$(readlink -f "$pmix_lib")")
  if [ -d "$pmix_libdir/pmix" ]; then
    mkdir -p "$tree/pmix/lib/pmix"
    cp "$pmix_libdir"/pmix/*.so "$tree/pmix/lib/pmix/"
    pmix_plugins=("$pmix_libdir"/pmix/*.so)
  fi
fi

# The shared libraries: everything the binaries, the launcher and the plugins load, except the C
# library itself (every machine has it) and CUDA's own (the GPU machine's driver and toolkit
# provide libcuda, libcudart, cuBLAS and NCCL; bringing ours would mismatch its driver).
system='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libutil\.so|libresolv\.so)'
gpu='^(libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so|libnvidia)'
{
  find "$tree/build" -type f -perm -u+x
  echo "$tree/ompi/bin/mpirun"; echo "$tree/ompi/bin/orted"
  printf '%s\n' "${plugins[@]}" "${pmix_plugins[@]}"
} | while read -r f; do
  ldd "$f" | awk '/=> \//{print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ $name =~ $system || $name =~ $gpu ]]; then continue; fi
  [ -e "$tree/lib/$name" ] || cp -L "$path" "$tree/lib/$name"
done
strip --strip-unneeded "$tree"/lib/*.so* 2>/dev/null || true

cp "$root"/clusters/*.json "$tree/clusters/"
cp "$root/bench/vs_pytorch.py" "$tree/bench/"
cp "$root/scripts/gpu-bundle-run.sh" "$tree/run.sh"
chmod +x "$tree/run.sh"
(cd "$root" && git rev-parse --short HEAD 2>/dev/null && git status --porcelain | grep -q . && echo "(with uncommitted changes)") \
  >"$tree/COMMIT" 2>/dev/null || true

rm -rf "$bundle"
mkdir -p "$bundle"
tar -C "$tree" -cf - . | xz -6 -T2 >"$bundle/payload.tar.xz"
cp "$tree/run.sh" "$tree/COMMIT" "$bundle/"
tree_mib=$(du -sk "$tree" | awk '{ printf "%.1f", $1 / 1024 }')

size_kib=$(du -sk "$bundle" | cut -f1)
size_mib=$(awk -v k="$size_kib" 'BEGIN { printf "%.1f", k / 1024 }')
echo "gpu-bundle.sh: $bundle: ${size_mib} MiB (run.sh, payload.tar.xz: ${tree_mib} MiB in $(find "$tree" -type f | wc -l) files unpacked)"
du -sh "$tree"/build/*/* "$tree/lib" "$tree/ompi" | sort -rh | head -6 | sed "s|$tree/||; s/^/  /"
if [ "$size_kib" -gt $((limit_mib * 1024)) ]; then
  echo "gpu-bundle.sh: the bundle is over ${limit_mib} MiB; it would not travel" >&2
  exit 1
fi

if [ $check = 1 ]; then
  # A bare machine here: Open MPI, PMIx, OpenBLAS and every library the bundle brings hidden
  # behind empty files and folders (a private mount namespace), and an empty environment.
  out=$build/check-out
  rm -rf "$out"
  mkdir -p "$out"
  hide=$(mktemp)
  # (the few the check's own tools load -- python3's libz, say -- stay: every machine has them)
  tools_need=" $(ldd /usr/bin/python3 /bin/bash /usr/bin/awk /usr/bin/timeout /bin/tar 2>/dev/null |
                 awk '/=>/{print $1}' | sort -u | tr '\n' ' ') "
  {
    for l in "$tree"/lib/*; do
      n=$(basename "$l")
      [[ $tools_need == *" $n "* ]] && continue
      for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu; do
        [ -e "$d/$n" ] && readlink -f "$d/$n" && echo "$d/$n"
      done
    done
    for b in mpirun mpiexec orterun orted; do command -v $b && readlink -f "$(command -v $b)"; done
  } | sort -u >"$hide"
  unshare -m --propagation private bash -c '
    set -e
    while read -r f; do [ -f "$f" ] && mount --bind /dev/null "$f"; done <"$1"
    for d in "$2" "$3" "$4"; do [ -d "$d" ] && mount -t tmpfs none "$d"; done
    exec env -i HOME=/tmp PATH=/usr/bin:/bin OUT="$5" "$6/run.sh"
  ' hide "$hide" "$(dirname "$ompi_libdir")" "$ompi_datadir" "${pmix_libdir:-/nonexistent}" \
    "$out" "$bundle" || true
  rm -f "$hide"
  echo
  cat "$out/summary.md"
  # Here no GPU is usable: every host part must pass and every GPU part be skipped.
  if grep -Eq '\| (FAILED|TIMEOUT) ' "$out/summary.md"; then
    echo "gpu-bundle.sh --check: a part failed here (logs: $out)" >&2
    exit 1
  fi
  echo "gpu-bundle.sh --check: host parts ok, GPU parts skipped (logs: $out)"
fi
