#!/usr/bin/env python3
"""Predicted step times of synth vs the baselines for HAP's four models on the given clusters.

Runs build/release/tools/hspmd-plan once per (model, cluster) at HAP's settings (32 samples per
device, 12 layers, hidden 768, seq 128; VGG19 on 32x32 images) and prints a Markdown table.
    python3 bench/plan_report.py clusters/hap-testbed.json clusters/homogeneous-8.json
"""
import re
import subprocess
import sys

TOOL = "build/release/tools/hspmd-plan"
MODELS = ["bert", "vit", "bert-moe", "vgg19"]


def to_seconds(text):
    value, unit = text.split()
    return float(value) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit]


def run(model, cluster):
    out = subprocess.run([TOOL, "--model", model, "--cluster", cluster], capture_output=True,
                         text=True, check=True).stdout
    times = {}
    for name in ["synth", "dp-ev", "dp-cp", "tp"]:
        m = re.search(r"^%s\s+([0-9.]+ (?:s|ms|us))" % re.escape(name), out, re.M)
        times[name] = to_seconds(m.group(1)) if m else None
    synth = re.search(r"^synthesis: ([0-9.]+) s", out, re.M)
    return times, float(synth.group(1))


def fmt(t):
    return "-" if t is None else ("%.3f s" % t if t >= 1 else "%.2f ms" % (t * 1e3))


def main():
    print("| cluster | model | synth | DP-EV | DP-CP | TP | best baseline / synth | synthesis time |")
    print("|---|---|---|---|---|---|---|---|")
    for cluster in sys.argv[1:]:
        for model in MODELS:
            t, secs = run(model, cluster)
            best = min(v for k, v in t.items() if k != "synth" and v is not None)
            print("| %s | %s | %s | %s | %s | %s | %.2fx | %.3f s |" % (
                cluster.split("/")[-1].replace(".json", ""), model, fmt(t["synth"]),
                fmt(t["dp-ev"]), fmt(t["dp-cp"]), fmt(t["tp"]), best / t["synth"], secs))


if __name__ == "__main__":
    main()
