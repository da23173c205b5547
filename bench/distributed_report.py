#!/usr/bin/env python3
"""Measured step time of the example models under mpirun, per plan: runs each plan N times and
prints the median (over runs) of each run's median step time, next to the predicted one (the
median over runs too: with --calibrate every run measures, and predicts, afresh).

    python3 bench/distributed_report.py --runs 5 -- build/release/examples/bert \
        --cluster clusters/emulated-2.json --layers 2 --hidden 256 --heads 4 --seq 64 \
        --batch 16 --vocab 2000 --steps 8

Prints a Markdown table (plan, measured median, min/max over runs, predicted, error, speedup
over DP-EV)."""
import argparse
import os
import re
import statistics
import subprocess
import sys

LINE = re.compile(r"step time measured ([0-9.]+) ms \(median\), predicted ([0-9.]+) ms")


def mpirun_match(cmd, np, pattern):
    """Runs `cmd` on `np` ranks (one BLAS thread each) and returns `pattern`'s match in its
    output; ends the script, with the output, when the run fails or prints no match."""
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
               OPENBLAS_NUM_THREADS="1")
    flags = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    out = subprocess.run(["mpirun"] + flags + ["-np", str(np)] + cmd, env=env,
                         capture_output=True, text=True, check=False)
    m = pattern.search(out.stdout)
    if out.returncode != 0 or not m:
        sys.exit(f"run failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    return m


def run(cmd, np):
    m = mpirun_match(cmd, np, LINE)
    return float(m.group(1)), float(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--plans", default="synth,dp-cp,tp,dp-ev")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command and a.command[0] == "--" else a.command
    rows = {}
    for plan in a.plans.split(","):
        got = [run(cmd + ["--plan", plan], a.np) for _ in range(a.runs)]
        measured = [m for m, _ in got]
        predicted = statistics.median(p for _, p in got)  # differs per run with --calibrate
        rows[plan] = (statistics.median(measured), min(measured), max(measured), predicted)
    base = rows.get("dp-ev", (None,))[0]
    print("| plan | measured (median of %d runs) | min – max | predicted | error | vs DP-EV |"
          % a.runs)
    print("|---|---|---|---|---|---|")
    for plan, (med, lo, hi, pred) in rows.items():
        err = 100.0 * (pred - med) / med
        speed = f"{base / med:.2f}x" if base else "-"
        print(f"| {plan} | {med:.1f} ms | {lo:.1f} – {hi:.1f} ms | {pred:.1f} ms | {err:+.0f}% "
              f"| {speed} |")
    errors = [abs(pred - med) / med for med, _, _, pred in rows.values()]
    print(f"\nmedian absolute prediction error: {100.0 * statistics.median(errors):.0f}%")


if __name__ == "__main__":
    main()
