#!/usr/bin/env bash
# Single-precision GEMM rate of each OpenBLAS kernel set on this machine, on the GEMM shapes of
# a BERT-small step (batch 16 x seq 64 rows, hidden 256, FFN 3072) and 1024^3: what
# exec/backends/blas.hpp's choice rests on. One thread, best of 7 after a warm-up; rounds
# alternate the kernel sets. Needs gcc and libopenblas-dev; not part of make test.
#   bench/blas_cores.sh [ROUNDS] [SETS...]      (default 2 rounds; Prescott Haswell Zen SkylakeX Cooperlake)
set -euo pipefail
rounds=${1:-2}
shift || true
sets=("$@")
[[ ${#sets[@]} -eq 0 ]] && sets=(Prescott Haswell Zen SkylakeX Cooperlake)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/g.c" <<'EOF'
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
char* openblas_get_corename(void);
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
int main(void) {
  const int shapes[5][3] = {{1024, 3072, 256}, {1024, 256, 3072}, {1024, 256, 256},
                            {256, 3072, 1024}, {1024, 1024, 1024}};
  const size_t big = 4u << 20;
  float *a = malloc(4 * big), *b = malloc(4 * big), *c = malloc(4 * big);
  for (size_t i = 0; i < big; i++) {
    a[i] = 1.0f / (i % 7 + 1);
    b[i] = 1.0f / (i % 5 + 1);
  }
  printf("%-11s", openblas_get_corename());
  for (int s = 0; s < 5; s++) {
    const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, a, k, b, n, 0, c, n);
    double best = 1e9;
    for (int r = 0; r < 7; r++) {
      const double t0 = now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, a, k, b, n, 0, c, n);
      const double t = now() - t0;
      if (t < best)
        best = t;
    }
    printf("  %dx%dx%d %6.1f", m, n, k, 2.0 * m * n * k / best / 1e9);
  }
  printf("   GFLOP/s\n");
  return 0;
}
EOF
gcc -O2 -I/usr/include/x86_64-linux-gnu/openblas-pthread "$dir/g.c" -o "$dir/g" -lopenblas
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); OpenBLAS's own choice: $(OPENBLAS_NUM_THREADS=1 "$dir/g" | cut -d' ' -f1)"
for ((r = 1; r <= rounds; r++)); do
  for s in "${sets[@]}"; do
    OPENBLAS_CORETYPE=$s OPENBLAS_NUM_THREADS=1 "$dir/g"
  done
done
