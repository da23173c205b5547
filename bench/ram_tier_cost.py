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

    python3 bench/ram_tier_cost.py [--build build/release] [--rounds 5] [--steps 12]
                                   [--every 1,4,auto] [--vs-build DIR]

With --every 1,4,auto each round runs A, then B with --ram-every 1, --ram-every 4 and
--ram-budget 0.05 (the cadence it chose is listed). --vs-build DIR adds B at every step with
DIR's binaries (an earlier commit's build) to each round.

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


def run(args, model, cl, ram, every="1", build=None):
    exe = os.path.join(build or args.build, "examples", model)
    tmp = tempfile.mkdtemp()
    shm = tempfile.mkdtemp(dir="/dev/shm") if ram else None
    try:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = mpirun() + [exe, "--quiet", "--steps", str(args.steps), "--batch", str(BATCH),
                          "--cluster", cl, "--plan", "synth", "--no-calibrate", "--metrics",
                          metrics] + MODELS[model]
        if ram:
            cmd += ["--checkpoint-dir", os.path.join(tmp, "ck"), "--ram-dir", shm]
            if every == "auto":
                cmd += ["--ram-budget", "0.05"]
            else:
                cmd += ["--ram-every", str(every)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("ram_tier_cost.py: run failed: %s\n%s%s" % (" ".join(cmd), r.stdout,
                                                                  r.stderr))
        lines = [json.loads(l) for l in open(metrics)]
        t = [l["t"] for l in lines if "step" in l and "seconds" in l]
        secs = [b - a for a, b in zip(t, t[1:])]
        tier = [l for l in lines if l.get("event") == "ram_tier"]
        cadence = [l for l in lines if l.get("event") == "ram_cadence"]
        if tier and cadence:
            tier[0]["every"] = cadence[0]["every"]
        # the mean: with --ram-every N only every Nth step saves; with --ram-budget, the steps
        # after the cadence was decided (step 13: the measured saves come before)
        return statistics.mean(secs[13 if every == "auto" else 2:]), (tier[0] if tier else None)
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
    ap.add_argument("--every", default="1",
                    help="--ram-every values, comma-separated; auto: --ram-budget 0.05")
    ap.add_argument("--vs-build", help="another build (an earlier commit's) whose RAM tier at "
                                       "every step runs in the same rounds")
    args = ap.parse_args()
    variants = [(e, e, None) for e in args.every.split(",")]
    if args.vs_build:
        variants.append(("1 (%s)" % args.vs_build, "1", args.vs_build))
    with tempfile.TemporaryDirectory() as d:
        cl = cluster(os.path.join(d, "two-nodes.json"))
        for model in args.models.split(","):
            a = []
            b = {v[0]: [] for v in variants}
            ratios = {v[0]: [] for v in variants}
            waited = {v[0]: [] for v in variants}
            chosen = {v[0]: [] for v in variants}
            mib = float("nan")
            for _ in range(args.rounds):
                ta, _ = run(args, model, cl, False)
                a.append(ta)
                for label, e, build in variants:
                    tb, tier = run(args, model, cl, True, e, build)
                    b[label].append(tb)
                    ratios[label].append(tb / ta)
                    if tier:
                        n = max(tier["saves"], 1)
                        waited[label].append((tier["waited_ms"] / n, tier["save_ms"] / n,
                                              tier["copy_ms"] / n))
                        mib = tier["bytes"] / 2**20
                        if "every" in tier:
                            chosen[label].append(tier["every"])
            for label, _, _ in variants:
                w = waited[label] or [(float("nan"),) * 3]
                print("%s-small, --ram-every %s: step %.1f ms without, %.1f ms with the RAM tier "
                      "(medians of the runs' means); with / without = %.3f (median of %d rounds; "
                      "range %.3f-%.3f); training waited %.2f ms a save (median; %.2f saving, "
                      "%.2f for the copy before an update), %.1f MiB a rank's slot%s" %
                      (model, label, 1e3 * statistics.median(a), 1e3 * statistics.median(b[label]),
                       statistics.median(ratios[label]), len(ratios[label]), min(ratios[label]),
                       max(ratios[label]), statistics.median(x[0] for x in w),
                       statistics.median(x[1] for x in w), statistics.median(x[2] for x in w),
                       mib, "; cadences chosen: %s" % chosen[label] if chosen[label] else ""))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
