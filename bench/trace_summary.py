#!/usr/bin/env python3
"""Where each rank's time went in a trace written with --trace: milliseconds of compute,
communication and idle per rank, and the largest collectives.

    python3 bench/trace_summary.py out.json
"""
import collections
import json
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    totals = collections.defaultdict(lambda: collections.Counter())
    comm = collections.Counter()
    for e in events:
        if e.get("ph") != "X" or e.get("tid") != 0:
            continue
        totals[e["pid"]][e["cat"]] += e["dur"] / 1e3
        if e["cat"] == "comm":
            comm[e["name"].split(" ")[0]] += e["dur"] / 1e3
    print("| rank | compute ms | communication ms | idle ms |")
    print("|---|---|---|---|")
    for pid in sorted(totals):
        t = totals[pid]
        print(f"| {names.get(pid, pid)} | {t['compute']:.1f} | {t['comm']:.1f} | {t['idle']:.1f} |")
    print("\ncommunication by kind (all ranks, ms):",
          ", ".join(f"{k} {v:.1f}" for k, v in comm.most_common()))


if __name__ == "__main__":
    main()
