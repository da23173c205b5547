#!/usr/bin/env python3
"""A straggler mid-run, with and without re-balancing: runs an example model under mpirun with
HSPMD_FAULT slowing one rank from a step on, alternating runs without and with --rebalance, and
prints the median step time after the event for both, their ratio, and the re-balances (when,
the LP re-solve time, the move time, the shares).

    python3 bench/straggler.py --runs 5 --fault rank:1,at:step5,kind:slow:3 -- \
        build/release/examples/bert --cluster clusters/emulated-2.json --layers 2 \
        --hidden 256 --heads 4 --seq 64 --batch 16 --vocab 2000 --steps 30

A step's time is the slowest rank's (the trainer's metrics file). "After the event" is every
step from the slowed one on; "settled" leaves out the steps up to the last re-balance of the
run (the same steps are left out of the run without re-balancing)."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile


def run(cmd, np, fault, extra):
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
        metrics = f.name
    env = dict(os.environ, HSPMD_FAULT=fault, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    flags = ["--oversubscribe", "-x", "HSPMD_FAULT"]
    flags += ["--allow-run-as-root"] if os.geteuid() == 0 else []
    out = subprocess.run(["mpirun"] + flags + ["-np", str(np)] + cmd + extra +
                         ["--metrics", metrics], env=env, capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        sys.exit(f"run failed ({out.returncode}): {' '.join(cmd + extra)}\n{out.stdout}\n"
                 f"{out.stderr}")
    steps, rebalances = {}, []
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            if "rebalance" in j:
                rebalances.append(j["rebalance"])
            elif "step" in j:
                steps[j["step"]] = j["seconds"]
    os.unlink(metrics)
    return steps, rebalances


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--fault", default="rank:1,at:step5,kind:slow:3")
    ap.add_argument("--rebalance", default="1.25", help="threshold given to --rebalance")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command and a.command[0] == "--" else a.command
    event = int(re.search(r"at:step([0-9]+)", a.fault).group(1))
    plain, balanced, settled_plain, settled_balanced, solves, moves, before = ([] for _ in range(7))
    events = []
    for _ in range(a.runs):  # A B A B ...
        s0, _ = run(cmd, a.np, a.fault, [])
        s1, reb = run(cmd, a.np, a.fault, ["--rebalance", a.rebalance])
        last = max([r["after_step"] for r in reb], default=event - 1)
        plain.append(statistics.median(t for k, t in s0.items() if k >= event))
        balanced.append(statistics.median(t for k, t in s1.items() if k >= event))
        settled_plain.append(statistics.median(t for k, t in s0.items() if k > last + 1))
        settled_balanced.append(statistics.median(t for k, t in s1.items() if k > last + 1))
        before.append(statistics.median(t for k, t in s0.items() if 1 < k < event))
        solves += [r["solve_ms"] for r in reb]
        moves += [r["move_ms"] for r in reb if r["move_ms"] > 0]
        events.append(reb)
    med = statistics.median
    print(f"fault {a.fault}, {a.runs} runs each, alternating; step time = slowest rank's")
    print(f"before the event (no re-balancing): {1e3 * med(before):.1f} ms")
    print("| after the event | without re-balancing | with --rebalance %s | ratio |" % a.rebalance)
    print("|---|---|---|---|")
    print(f"| every step from step {event} | {1e3 * med(plain):.1f} ms | {1e3 * med(balanced):.1f}"
          f" ms | {med(plain) / med(balanced):.2f}x |")
    print(f"| after the last re-balance | {1e3 * med(settled_plain):.1f} ms | "
          f"{1e3 * med(settled_balanced):.1f} ms | {med(settled_plain) / med(settled_balanced):.2f}x |")
    if solves:
        print(f"\nratio LP re-solve: median {med(solves):.2f} ms, max {max(solves):.2f} ms "
              f"({len(solves)} re-solves); state moved in median {med(moves) if moves else 0:.1f} ms")
    for i, reb in enumerate(events):
        desc = "; ".join(
            f"after step {r['after_step']}: factors {', '.join(f'{f:.2f}' for f in r['factors'])}"
            f", shares {', '.join(f'{100 * x:.1f}%' for x in r['shares_before'])} -> "
            f"{', '.join(f'{100 * x:.1f}%' for x in r['shares_after'])}" for r in reb)
        print(f"run {i + 1}: {desc or 'no re-balance'}")


if __name__ == "__main__":
    main()
