#!/usr/bin/env python3
"""Parity: a mixed cluster against a homogeneous cluster of equal total speed.

    python3 bench/parity.py [--build build/release] [--rounds 5] [--steps 12]
                            [--only measured|simulated] [--devices 64,1024]

measured   two ranks on this machine, synthesized plans, alternating (mixed, homogeneous, ...):
           the mixed cluster emulates rank 1 two times slower (slowdowns 1 and 2), the
           homogeneous one both ranks 4/3 slower (slowdowns 4/3 and 4/3): the same total speed
           (1 + 1/2 = 3/4 + 3/4). BERT-small and Llama-small (vs_pytorch.py's shapes), global
           batch 16. Each run calibrates (emulated devices), so both plans fit this machine.
           Throughput ratio = homogeneous step / mixed step, per round; the median is reported.
           1.0 means the mixed cluster loses nothing to its unevenness.
simulated  hspmd-plan --simulate on n devices of three kinds (4e14, 2e14 and 1e14 flop/s, a third
           of the nodes each, 80 GiB each) against n devices of one kind at their mean speed, same
           memory and links (8 per node, 2.4e11 B/s inside, 200 Gbit/s between): the one-level
           plan's simulated step and the two-level plan's predicted step (hspmd-plan simulates
           one-level plans only); the ratio takes the better of the two on each side. BERT-large
           at 32 samples per device, Llama-7B at 8 (at 32 its activations fit no device).

Builds nothing: cmake --build --preset release --target bert llama hspmd-plan. Timings go to
docs/benchmarks.md with the commit, the machine and the BLAS kernel set (printed first).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BERT = ["--layers", "2", "--hidden", "256", "--ffn", "3072", "--heads", "4", "--seq", "64",
        "--vocab", "2000"]
LLAMA = ["--layers", "2", "--hidden", "256", "--ffn", "688", "--heads", "4", "--seq", "64",
         "--vocab", "2000"]
BATCH = 16


def two_rank_cluster(path, slowdowns):
    devices = []
    for i, s in enumerate(slowdowns):
        devices.append({"name": "cpu%d" % i, "kind": "cpu", "speed": 5e10 / s,
                        "memory": "4 GiB", "node": 0, "slowdown": s})
    with open(path, "w") as f:
        json.dump({"version": 1, "name": os.path.basename(path)[:-5],
                   "links": {"intra_node": {"bandwidth": 5e9, "latency": 1e-6}},
                   "devices": devices}, f)
    return path


def mpirun(n):
    flags = ["--oversubscribe"]
    if os.geteuid() == 0:
        flags.append("--allow-run-as-root")
    return ["mpirun", "-np", str(n)] + flags


def run_step(args, model, cluster):
    exe = os.path.join(args.build, "examples", model)
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = mpirun(2) + [exe, "--quiet", "--steps", str(args.steps), "--batch", str(BATCH),
                           "--cluster", cluster, "--plan", "synth", "--metrics", metrics]
        cmd += BERT if model == "bert" else LLAMA
        env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit("parity.py: run failed: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
        secs = [json.loads(l)["seconds"] for l in open(metrics) if '"step"' in l]
    return statistics.median(secs[2:])


def blas_line(args):
    exe = os.path.join(args.build, "examples", "bert")
    r = subprocess.run([exe, "--steps", "1", "--layers", "1", "--hidden", "16", "--heads", "2",
                        "--seq", "8", "--vocab", "32", "--batch", "2"],
                       capture_output=True, text=True)
    return next((l for l in r.stdout.splitlines() if l.startswith("BLAS:")), "BLAS: ?")


def measured(args):
    print(blas_line(args))
    with tempfile.TemporaryDirectory() as tmp:
        mixed = two_rank_cluster(os.path.join(tmp, "mixed.json"), [1.0, 2.0])
        homo = two_rank_cluster(os.path.join(tmp, "homogeneous.json"), [4.0 / 3, 4.0 / 3])
        for model in ("bert", "llama"):
            got = {"mixed": [], "homogeneous": []}
            for r in range(args.rounds):
                got["mixed"].append(run_step(args, model, mixed))
                got["homogeneous"].append(run_step(args, model, homo))
                print("  %s round %d: mixed %.1f ms, homogeneous %.1f ms" %
                      (model, r + 1, 1e3 * got["mixed"][-1], 1e3 * got["homogeneous"][-1]),
                      flush=True)
            ratios = [h / m for m, h in zip(got["mixed"], got["homogeneous"])]
            print("%s-small: mixed %.1f ms, homogeneous %.1f ms (medians); throughput mixed / "
                  "homogeneous = %.3f (median of %d rounds; range %.3f-%.3f)\n" %
                  (model, 1e3 * statistics.median(got["mixed"]),
                   1e3 * statistics.median(got["homogeneous"]), statistics.median(ratios),
                   len(ratios), min(ratios), max(ratios)), flush=True)


KINDS3 = [("fast", 4e14), ("mid", 2e14), ("slow", 1e14)]
# Samples per device: Llama-7B's activations at 32 a device fit no 80 GiB device.
PER_DEVICE = {"llama-7b": 8}


def big_cluster(path, n, kinds):
    nodes = n // 8
    devices = []
    for node in range(nodes):
        name, speed = kinds[node * len(kinds) // nodes]
        devices.append({"name": "%s-%d" % (name, node), "kind": name, "speed": speed,
                        "memory": "80 GiB", "node": node, "count": 8})
    with open(path, "w") as f:
        json.dump({"version": 1, "name": os.path.basename(path)[:-5],
                   "links": {"intra_node": {"bandwidth": 2.4e11, "latency": 2e-6},
                             "inter_node": {"bandwidth": 2.5e10, "latency": 1e-5}},
                   "devices": devices}, f)
    return path


def plan_steps(args, model, cluster):
    exe = os.path.join(args.build, "tools", "hspmd-plan")
    cmd = [exe, "--model", model, "--cluster", cluster, "--no-baselines", "--simulate",
           "--hierarchical", "--per-device", str(PER_DEVICE.get(model, 32))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = r.stdout + r.stderr
    # the simulated table's row: "synth  <cost model> <unit>  <simulated> <unit>  <ratio>x ..."
    sim = re.search(r"^synth\s+\S+ \S+\s+(\S+) (\S+)\s+[0-9.]+x", out, re.M)
    two = re.search(r"^two-lvl\s+(\S+) (\S+)", out, re.M)  # predicted (not simulated)

    def seconds(m):
        if not m:
            return None
        v, unit = float(m.group(1)), m.group(2)
        return v * {"s": 1.0, "ms": 1e-3, "us": 1e-6, "min": 60.0}.get(unit, 1.0)
    return seconds(sim), seconds(two), out


def simulated(args):
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.devices:
            mixed = big_cluster(os.path.join(tmp, "mixed-%d.json" % n), n, KINDS3)
            nodes = n // 8
            # one kind at the mixed cluster's mean speed (node-weighted as big_cluster assigns)
            total = sum(KINDS3[node * 3 // nodes][1] for node in range(nodes))
            homo = big_cluster(os.path.join(tmp, "homo-%d.json" % n), n,
                               [("one", total / nodes)])
            for model in args.models:
                m1, m2, mout = plan_steps(args, model, mixed)
                h1, h2, hout = plan_steps(args, model, homo)
                if m1 is None and m2 is None or h1 is None and h2 is None:
                    print("%s at %d devices: no plan\n%s\n%s" % (model, n, mout[-600:], hout[-600:]))
                    continue
                best_m = min(x for x in (m1, m2) if x is not None)
                best_h = min(x for x in (h1, h2) if x is not None)
                print("%-10s %5d devices: mixed (3 kinds) %s, homogeneous %s; simulated "
                      "throughput mixed / homogeneous = %.3f" %
                      (model, n, fmt(m1, m2), fmt(h1, h2), best_h / best_m), flush=True)


def fmt(one, two):
    parts = []
    if one is not None:
        parts.append("one-level %.3g s simulated" % one)
    if two is not None:
        parts.append("two-level %.3g s predicted" % two)
    return " / ".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--only", choices=["measured", "simulated"])
    ap.add_argument("--devices", default="64,1024")
    ap.add_argument("--models", default="bert-large,llama-7b")
    args = ap.parse_args()
    args.devices = [int(x) for x in args.devices.split(",")]
    args.models = args.models.split(",")
    if args.only in (None, "measured"):
        measured(args)
    if args.only in (None, "simulated"):
        simulated(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
