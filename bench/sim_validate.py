#!/usr/bin/env python3
"""Predicted against measured step time: the additive cost model and the step simulator
(sim/step.hpp) next to what the example models measure under mpirun.

    python3 bench/sim_validate.py [--runs 3] [--slowdowns 1.5,2,3] [--models bert,llama,vit,...]
                                  [--plans synth,dp-ev,dp-cp,tp] [--np 2] [--steps 8]

Builds nothing: run `cmake --build --preset release` first. For each model and each emulated
2-rank cluster (rank 1's compute stretched by the slowdown, clusters/emulated-2.json's shape) it
trains every plan with --calibrate (the run measures its own op times and collectives, and both
predictors price with them), the plans in turn A B C D A B C D ..., and reads the trainer's
summary line: the measured median step, the cost model's prediction and the simulator's. Prints
per case a Markdown table (median over runs) and whether each predictor orders the plans as
measured (pairs measured within 5 % of each other count as ties, either order kept), then the
median and largest absolute error of each predictor over all runs' medians.

Use np 2 for timings: more ranks than this machine's two cores distort them."""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distributed_report import mpirun_match  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r"step time measured ([0-9.]+) ms \(median\), predicted ([0-9.]+) (ms|s) "
                  r"\([^)]*\), simulated ([0-9.]+) (ms|s)")
MODELS = {
    "bert": ["bert", "--layers", "2", "--hidden", "256", "--ffn", "1024", "--heads", "4",
             "--seq", "64", "--vocab", "2000", "--batch", "16"],
    "bert-moe": ["bert", "--layers", "2", "--hidden", "256", "--ffn", "512", "--heads", "4",
                 "--seq", "32", "--vocab", "2000", "--batch", "16", "--moe-experts", "4"],
    "llama": ["llama", "--layers", "2", "--hidden", "256", "--heads", "4", "--seq", "64",
              "--vocab", "2000", "--batch", "16"],
    "vit": ["vit", "--layers", "2", "--hidden", "256", "--ffn", "1024", "--heads", "4",
            "--batch", "16"],
    "vgg19": ["vgg19", "--width", "0.25", "--batch", "16"],
}


def cluster(slowdown, path):
    devices = [{"name": "cpu0", "kind": "cpu", "speed": 5e10, "memory": "4 GiB", "node": 0},
               {"name": "cpu1", "kind": "cpu", "speed": 5e10 / slowdown, "memory": "4 GiB",
                "node": 0, "slowdown": slowdown}]
    with open(path, "w") as f:
        json.dump({"version": 1, "name": f"emulated-2-x{slowdown:g}",
                   "links": {"intra_node": {"bandwidth": 5e9, "latency": 1e-6}},
                   "devices": devices}, f)


def ms(value, unit):
    return float(value) * (1000.0 if unit == "s" else 1.0)


def run(cmd, np):
    m = mpirun_match(cmd, np, LINE)
    return float(m.group(1)), ms(m.group(2), m.group(3)), ms(m.group(4), m.group(5))


def order_kept(measured, predicted, tie=0.05):
    """Whether every pair of plans measured more than `tie` apart is predicted in that order."""
    names = list(measured)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if abs(measured[a] - measured[b]) <= tie * min(measured[a], measured[b]):
                continue
            if (measured[a] < measured[b]) != (predicted[a] < predicted[b]):
                return False
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--slowdowns", default="1.5,2,3")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--plans", default="synth,dp-ev,dp-cp,tp")
    a = ap.parse_args()
    plans = a.plans.split(",")
    errors = {"cost model": [], "simulated": []}
    kept = {"cost model": 0, "simulated": 0}
    cases = 0
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            if model not in MODELS:
                sys.exit(f"unknown model {model!r}: one of {', '.join(MODELS)}")
            exe, *flags = MODELS[model]
            for s in (float(x) for x in a.slowdowns.split(",")):
                path = os.path.join(tmp, f"x{s:g}.json")
                cluster(s, path)
                got = {p: [] for p in plans}
                for _ in range(a.runs):
                    for p in plans:  # in turn, so that drift touches every plan alike
                        cmd = [os.path.join(ROOT, "build/release/examples", exe)] + flags + [
                            "--cluster", path, "--plan", p, "--steps", str(a.steps),
                            "--calibrate"]
                        got[p].append(run(cmd, a.np))
                med = {p: statistics.median(m for m, _, _ in got[p]) for p in plans}
                cm = {p: statistics.median(c for _, c, _ in got[p]) for p in plans}
                sm = {p: statistics.median(x for _, _, x in got[p]) for p in plans}
                print(f"\n### {model}, rank 1 {s:g}x slower (np {a.np}, {a.runs} runs)\n")
                print("| plan | measured | cost model | error | simulated | error |")
                print("|---|---|---|---|---|---|")
                for p in plans:
                    e_c = (cm[p] - med[p]) / med[p]
                    e_s = (sm[p] - med[p]) / med[p]
                    errors["cost model"].append(abs(e_c))
                    errors["simulated"].append(abs(e_s))
                    print(f"| {p} | {med[p]:.1f} ms | {cm[p]:.1f} ms | {100 * e_c:+.1f}% "
                          f"| {sm[p]:.1f} ms | {100 * e_s:+.1f}% |")
                cases += 1
                for name, pred in (("cost model", cm), ("simulated", sm)):
                    ok = order_kept(med, pred)
                    kept[name] += 1 if ok else 0
                    print(f"\n{name}: ranking {'kept' if ok else 'NOT kept'}", end="")
                print(f"  (measured: {' < '.join(sorted(plans, key=med.get))})")
                sys.stdout.flush()
    print(f"\n## Over {cases} case(s), {len(errors['simulated'])} plan medians\n")
    print("| predictor | median abs error | max abs error | rankings kept |")
    print("|---|---|---|---|")
    for name, e in errors.items():
        print(f"| {name} | {100 * statistics.median(e):.1f}% | {100 * max(e):.1f}% "
              f"| {kept[name]} of {cases} |")


if __name__ == "__main__":
    main()
