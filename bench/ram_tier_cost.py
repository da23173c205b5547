#!/usr/bin/env python3
"""What the RAM tier costs a training step (docs/benchmarks.md "RAM tier").

Two ranks on two emulated nodes (one each, equal speeds), BERT-small and Llama-small (the
parity benchmark's shapes), 12 steps, synthesized plans. Each round runs the model without the
RAM tier (A) and with it (B: --ram-dir under /dev/shm, kept after every step, each rank's slot
copied to the other node's rank), alternating A B A B; per round the ratio of median step times
B / A, a run's step time being the mean wall-clock time between consecutive steps' metrics
lines over steps 3..12 (the save after a step counts in the next step's time). Reported: the median ratio and its range over the rounds, the step times,
and what the run says training waited per save (its metrics record: the save itself -- the
run's metadata, the state's list, the tier -- and, before updates, copies not done yet).

    python3 bench/ram_tier_cost.py [--build build/release] [--rounds 5] [--steps 12] [--every 1,4]

With --every 1,4 each round runs A, then B with --ram-every 1, then B with --ram-every 4.

Builds nothing: cmake --build --preset release --target bert llama.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {
    "bert": ["--layers", "2", "--hidden", "256", "--ffn", "3072", "--heads", "4", "--seq", "64",
             "--vocab", "2000"],
    "llama": ["--layers", "2", "--hidden", "256", "--ffn", "688", "--heads", "4", "--seq", "64",
              "--vocab", "2000"],
}
BATCH = 16


def cluster(path):
    devices = [{"name": "cpu%d" % i, "kind": "cpu", "speed": 5e10, "memory": "4 GiB", "node": i}
               for i in range(2)]
    with open(path, "w") as f:
        json.dump({"version": 1, "name": "two-nodes",
                   "links": {"intra_node": {"bandwidth": 5e9, "latency": 1e-6},
                             "inter_node": {"bandwidth": 5e9, "latency": 1e-6}},
                   "devices": devices}, f)
    return path


def mpirun():
    flags = ["--oversubscribe"]
    if os.geteuid() == 0:
        flags.append("--allow-run-as-root")
    return ["mpirun", "-np", "2"] + flags


def run(args, model, cl, ram, every=1):
    exe = os.path.join(args.build, "examples", model)
    tmp = tempfile.mkdtemp()
    shm = tempfile.mkdtemp(dir="/dev/shm") if ram else None
    try:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = mpirun() + [exe, "--quiet", "--steps", str(args.steps), "--batch", str(BATCH),
                          "--cluster", cl, "--plan", "synth", "--no-calibrate", "--metrics",
                          metrics] + MODELS[model]
        if ram:
            cmd += ["--checkpoint-dir", os.path.join(tmp, "ck"), "--ram-dir", shm,
                    "--ram-every", str(every)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("ram_tier_cost.py: run failed: %s\n%s%s" % (" ".join(cmd), r.stdout,
                                                                  r.stderr))
        lines = [json.loads(l) for l in open(metrics)]
        t = [l["t"] for l in lines if "step" in l and "seconds" in l]
        secs = [b - a for a, b in zip(t, t[1:])]
        tier = [l for l in lines if l.get("event") == "ram_tier"]
        # the mean: with --ram-every N only every Nth step saves
        return statistics.mean(secs[2:]), (tier[0] if tier else None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if shm:
            shutil.rmtree(shm, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--models", default="bert,llama")
    ap.add_argument("--every", default="1", help="--ram-every values, comma-separated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cl = cluster(os.path.join(d, "two-nodes.json"))
        everies = [int(e) for e in args.every.split(",")]
        for model in args.models.split(","):
            a = []
            b = {e: [] for e in everies}
            ratios = {e: [] for e in everies}
            waited = {e: [] for e in everies}
            mib = float("nan")
            for _ in range(args.rounds):
                ta, _ = run(args, model, cl, False)
                a.append(ta)
                for e in everies:
                    tb, tier = run(args, model, cl, True, e)
                    b[e].append(tb)
                    ratios[e].append(tb / ta)
                    if tier:
                        n = max(tier["saves"], 1)
                        waited[e].append((tier["waited_ms"] / n, tier["save_ms"] / n,
                                          tier["copy_ms"] / n))
                        mib = tier["bytes"] / 2**20
            for e in everies:
                w = waited[e] or [(float("nan"),) * 3]
                print("%s-small, --ram-every %d: step %.1f ms without, %.1f ms with the RAM tier "
                      "(medians of the runs' means); with / without = %.3f (median of %d rounds; range %.3f-%.3f); "
                      "training waited %.2f ms a save (median; %.2f saving, %.2f for the copy "
                      "before an update), %.1f MiB a rank's slot" %
                      (model, e, 1e3 * statistics.median(a), 1e3 * statistics.median(b[e]),
                       statistics.median(ratios[e]), len(ratios[e]), min(ratios[e]),
                       max(ratios[e]), statistics.median(x[0] for x in w),
                       statistics.median(x[1] for x in w), statistics.median(x[2] for x in w),
                       mib))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
