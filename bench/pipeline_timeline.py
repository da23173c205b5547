#!/usr/bin/env python3
"""Draws a pipeline trace (hspmd-pipeline-bench --trace, or exec::pipeline_executor's
collect_trace) as text: one row per rank, time left to right, each forward "F<micro>" and
backward "B<micro>" (split: input part "B", weight part "W") over the columns it ran, "~" where
the rank waited for a boundary value (a receive), "." idle; then each rank's spans in order with
their times.

    python3 bench/pipeline_timeline.py pipeline.trace.json [--width 100]
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--width", type=int, default=100)
    a = ap.parse_args()
    events = [e for e in json.load(open(a.trace))["traceEvents"] if e.get("ph") == "X"]
    work = [e for e in events if e["name"] != "idle"]
    t0 = min(e["ts"] for e in work)
    t1 = max(e["ts"] + e["dur"] for e in work)
    per = (t1 - t0) / a.width
    ranks = sorted({e["pid"] for e in work})
    print(f"{(t1 - t0) / 1e3:.1f} ms, one column {per / 1e3:.2f} ms")
    for r in ranks:
        row = ["."] * a.width
        mine = sorted((e for e in work if e["pid"] == r), key=lambda e: e["ts"])
        for e in mine:
            first = int((e["ts"] - t0) / per)
            last = max(first + 1, int((e["ts"] + e["dur"] - t0) / per))
            args = e.get("args", {})
            if "pass" in args:
                letter = {"forward": "F", "backward_weight": "W"}.get(args["pass"], "B")
                label = letter + str(args["micro"])
            elif e["name"].startswith("recv"):
                label = "~"
            else:
                continue
            for c in range(first, min(last, a.width)):
                row[c] = label[(c - first) % len(label)] if label != "~" else "~"
        print(f"rank {r} |{''.join(row)}|")
    for r in ranks:
        print(f"\nrank {r}:")
        for e in sorted((e for e in work if e["pid"] == r), key=lambda e: e["ts"]):
            print(f"  {(e['ts'] - t0) / 1e3:8.1f} ms  {e['dur'] / 1e3:7.1f} ms  {e['name']}")


if __name__ == "__main__":
    main()
