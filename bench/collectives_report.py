#!/usr/bin/env python3
"""Summarizes repeated hspmd-collectives launches (their --json files) into markdown tables.

  bench/collectives_report.py overhead RUN1.json RUN2.json ...
      hspmd vs direct MPI: median over launches of each row's median time and busbw.
  bench/collectives_report.py uneven RUN1.json RUN2.json ...
      per size: each algorithm's time (median over launches), the best one, what automatic
      picked, and automatic's time relative to the best.
Only the standard library is used.
"""
import json
import statistics
import sys
from collections import defaultdict


def load(files):
    runs = [json.load(open(f)) for f in files]
    return runs


def human(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def overhead(runs):
    rows = defaultdict(list)
    for run in runs:
        for r in run["rows"]:
            rows[(r["op"], r["bytes"])].append(r)
    print("| op | size | hspmd busbw (GB/s) | MPI busbw (GB/s) | hspmd / MPI | hspmd median (us) | MPI median (us) |")
    print("|---|---|---|---|---|---|---|")
    for (op, size), rs in sorted(rows.items()):
        h = statistics.median(r["busbw_GBps"] for r in rs)
        m = statistics.median(r["mpi"]["busbw_GBps"] for r in rs)
        ht = statistics.median(r["time_us"]["median"] for r in rs)
        mt = statistics.median(r["mpi"]["time_us"]["median"] for r in rs)
        print(f"| {op} | {human(size)} | {h:.3f} | {m:.3f} | {100 * h / m:.1f}% | {ht:.1f} | {mt:.1f} |")


def uneven(runs):
    times = defaultdict(list)  # (op, bytes, algorithm) -> [median time per launch]
    picks = defaultdict(list)  # (op, bytes) -> [algorithm automatic picked, per launch]
    auto = defaultdict(list)   # (op, bytes) -> [automatic's time per launch]
    for run in runs:
        for r in run["rows"]:
            alg = r["algorithm"]
            key = (r["op"], r["bytes"])
            if alg.startswith("automatic>"):
                picks[key].append(alg.split(">")[1])
                auto[key].append(r["time_us"]["median"])
            else:
                times[(r["op"], r["bytes"], alg)].append(r["time_us"]["median"])
    print(f"ratios {runs[0]['ratios']}, {runs[0]['ranks']} ranks, {len(runs)} launches")
    print()
    print("| op | size | padded (us) | grouped (us) | native (us) | best | automatic picked | picked / best | automatic row (us) | row / best |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    worst_pick = 0.0
    within = 0
    for key in sorted(picks):
        op, size = key
        med = {a: statistics.median(times[(op, size, a)]) for a in ("padded", "grouped", "native")}
        best = min(med, key=med.get)
        pick_counts = defaultdict(int)
        for p in picks[key]:
            pick_counts[p] += 1
        pick = ", ".join(f"{p} x{c}" if len(pick_counts) > 1 else p for p, c in sorted(pick_counts.items()))
        # automatic's cost: the launch-median time of what it picked in each launch.
        # The algorithm's own rows are measured alike; the automatic row is a separate
        # measurement of the picked algorithm, so it also shows run-to-run noise.
        majority = max(sorted(pick_counts), key=pick_counts.get)
        pick_ratio = med[majority] / med[best]
        a = statistics.median(auto[key])
        ratio = a / med[best]
        worst = max(worst, ratio)
        worst_pick = max(worst_pick, pick_ratio)
        within += pick_ratio <= 1.10
        print(f"| {op} | {human(size)} | {med['padded']:.1f} | {med['grouped']:.1f} | {med['native']:.1f} | "
              f"{best} | {pick} | {pick_ratio:.2f} | {a:.1f} | {ratio:.2f} |")
    print()
    print(f"picked (majority) within 10% of the best in {within} of {len(picks)} sizes; "
          f"worst picked / best {worst_pick:.2f}; worst automatic row / best {worst:.2f}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("overhead", "uneven"):
        sys.exit(__doc__)
    {"overhead": overhead, "uneven": uneven}[sys.argv[1]](load(sys.argv[2:]))
