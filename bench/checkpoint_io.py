#!/usr/bin/env python3
"""Checkpoint save and load throughput of the library trainer against plain write calls.

    python3 bench/checkpoint_io.py [--runs 5] [--np 2] [-- extra flags for the example]

Builds nothing: run `cmake --build --preset release --target bert` first. Each round, alternating:
  hspmd: `bert --steps 1 --save-every 1` under mpirun (BERT-base by default: the example's own
         sizes), its "checkpoint after step 1 (X ms)" line; then `--resume` of the same directory
         (nothing left to train), its "loaded in Y ms" line;
  plain: NP processes at once, each writing as many bytes as its rank's file holds from a buffer
         of that size with os.write in 8 MiB calls and one fsync, then reading them back into a
         buffer of that size in 8 MiB calls (from the page cache, as the load after the save does).
Prints per-rank MB/s of each and the ratio, medians over the rounds.
"""
import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import Process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpirun(np_, args):
    cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(np_)] + args
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OPENBLAS_NUM_THREADS="1")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout


def plain_write(path, size, out):
    chunk = 8 << 20
    src = memoryview(bytearray(b"\x01") * size)  # touched, as a model's parameters are
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    at = 0
    while at < size:
        at += os.write(fd, src[at:at + chunk])
    os.fsync(fd)
    os.close(fd)
    t1 = time.perf_counter()
    dst = memoryview(bytearray(size))  # where the values live after a load
    with open(path, "rb", buffering=0) as f:
        at = 0
        while at < size:
            n = f.readinto(dst[at:at + chunk])
            if not n:
                break
            at += n
    t2 = time.perf_counter()
    with open(out, "w") as f:
        f.write(f"{t1 - t0} {t2 - t1}\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    exe = os.path.join(ROOT, "build/release/examples/bert")
    cluster = os.path.join(ROOT, f"clusters/emulated-{a.np}.json")
    rows = []
    for r in range(a.runs):
        d = tempfile.mkdtemp(prefix="hspmd-ckpt-bench-")
        base = [exe, "--cluster", cluster, "--checkpoint-dir", d] + a.extra
        out = mpirun(a.np, base + ["--steps", "1", "--save-every", "1"])
        save_ms = float(re.search(r"checkpoint after step 1: \S+ \(([0-9.]+) ms\)", out).group(1))
        out = mpirun(a.np, base + ["--steps", "1", "--resume"])
        load_ms = float(re.search(r"loaded in ([0-9.]+) ms\)", out).group(1))
        files = sorted(glob.glob(os.path.join(d, "step-00000001", "rank-*.safetensors")))
        sizes = [os.path.getsize(f) for f in files]
        # Plain writes of the same sizes, all ranks at once.
        procs, outs = [], []
        for i, s in enumerate(sizes):
            o = os.path.join(d, f"plain-{i}.time")
            p = Process(target=plain_write, args=(os.path.join(d, f"plain-{i}.bin"), s, o))
            p.start()
            procs.append(p)
            outs.append(o)
        for p in procs:
            p.join()
        times = [list(map(float, open(o).read().split())) for o in outs]
        biggest = max(sizes)
        w = max(t[0] for t in times)
        rd = max(t[1] for t in times)
        rows.append((biggest / save_ms / 1e3, biggest / w / 1e6, biggest / load_ms / 1e3, biggest / rd / 1e6, sum(sizes)))
        print(f"round {r + 1}: {sum(sizes) / 1e6:.1f} MB in {len(sizes)} files (largest {biggest / 1e6:.1f} MB); "
              f"save {save_ms:.0f} ms, load {load_ms:.0f} ms; plain write {w * 1e3:.0f} ms, read {rd * 1e3:.0f} ms",
              flush=True)
        shutil.rmtree(d)
    med = [statistics.median(c) for c in zip(*rows)]
    print(f"median MB/s of the largest rank: save {med[0]:.0f} vs plain write+fsync {med[1]:.0f} "
          f"({med[0] / med[1]:.2f}x); load {med[2]:.0f} vs plain read {med[3]:.0f} ({med[2] / med[3]:.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
