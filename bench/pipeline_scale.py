#!/usr/bin/env python3
"""Pipeline planning against the device count: the joint search's plan beside the baselines.

    python3 bench/pipeline_scale.py [--devices 64,256,1024,4096] [--model bert-large@8,llama-7b@1]
                                    [--no-hierarchical] [--svg out.svg] [-- extra hspmd-plan flags]

Builds nothing: run `cmake --build --preset release --target hspmd-plan` first. For each device
count it writes bench/synth_scale.py's cluster (n/8 nodes of 8 GPUs, a quarter each H100, A100,
V100, T4) and runs `hspmd-plan --pipeline auto --hierarchical --simulate` for each model
("model@R": R rows a device, the batch R x n). It prints, per model and count: the one-level
plan's predicted / simulated step, the two-level plan's predicted one (hspmd-plan does not
simulate it), the best pipeline-only baseline's (equal groups, even cuts, DP-EV inside;
simulated), the joint search's pick (depth, grouping, m; ranked by the simulated step) with its
predicted and simulated steps and simulated bubble, its lead over the best baseline, and the pipeline search's own time (hspmd-plan's
"planned in") with the whole run's wall time and peak memory. --svg plots the pipeline search's
time against devices (log-log, one line per model).
"""
import argparse
import importlib.util
import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("synth_scale",
                                               os.path.join(ROOT, "bench", "synth_scale.py"))
scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scale)

UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


def seconds(text):
    """'178.35 ms' -> 0.17835; None for '-' or nothing."""
    if not text:
        return None
    m = re.match(r"([0-9.]+) (\w+)", text.strip())
    return float(m.group(1)) * UNITS[m.group(2)] if m and m.group(2) in UNITS else None


def parse(out):
    r = {}
    m = re.search(r"^synth +(\S+ \S+)", out, re.M)
    r["one"] = seconds(m.group(1)) if m else None
    m = re.search(r"^synth +\S+ \S+ +(\S+ \S+) +[0-9.]+x ", out, re.M)
    r["one_sim"] = seconds(m.group(1)) if m else None
    m = re.search(r"^two-lvl +(\S+ \S+)", out, re.M)
    r["two"] = seconds(m.group(1)) if m else None
    only, joint = [], []
    for m in re.finditer(r"^(\d+) +(equal(?: 2L)?|speed(?: 2L)?|pipeline-only) +(\d+) +"
                         r"(\S+ \S+) +([0-9.]+)% +(\S+ \S+) +([0-9.]+)%", out, re.M):
        # (simulated step, stages, grouping, m, simulated bubble, predicted step)
        row = (seconds(m.group(6)), int(m.group(1)), m.group(2), int(m.group(3)),
               float(m.group(7)), seconds(m.group(4)))
        (only if m.group(2) == "pipeline-only" else joint).append(row)
    r["only"] = min(only) if only else None
    r["joint"] = min(joint) if joint else None
    m = re.search(r"^pipeline plan: .*planned in ([0-9.]+) s", out, re.M)
    r["search"] = float(m.group(1)) if m else None
    m = re.search(r"^pipeline plan: .* groups, (\S+), ", out, re.M)
    r["schedule"] = m.group(1) if m else None
    m = re.search(r"\((\d+) stage plans synthesized, (\d+) reused", out)
    r["made"] = (int(m.group(1)), int(m.group(2))) if m else None
    return r


def text(s):
    if s is None:
        return "-"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s" if s < 120 else f"{s / 60:.2f} min"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", default="64,256,1024,4096")
    ap.add_argument("--model", default="bert-large@8,llama-7b@1,llama-70b@1")
    ap.add_argument("--no-hierarchical", action="store_true")
    ap.add_argument("--svg")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    tool = os.path.join(ROOT, "build/release/tools/hspmd-plan")
    series = {}
    print(f"{'model':>10} {'devices':>7} {'one-level':>21} {'two-level':>10} {'pipe-only':>10} "
          f"{'joint pick':>20} {'predicted':>10} {'simulated':>10} {'bubble':>7} {'lead':>6} "
          f"{'search':>8} {'run':>8} {'MiB':>5}  made/reused")
    with tempfile.TemporaryDirectory() as d:
        for spec in a.model.split(","):
            model, _, rows = spec.partition("@")
            for n in (int(x) for x in a.devices.split(",")):
                path = os.path.join(d, f"c{n}.json")
                scale.cluster(n, path)
                cmd = [tool, "--model", model, "--cluster", path, "--per-device", rows or "1",
                       "--no-baselines", "--pipeline", "auto", "--simulate"] + a.extra
                if not a.no_hierarchical:
                    cmd.append("--hierarchical")
                rc, out, wall, peak = scale.run(cmd)
                r = parse(out)
                # the best baseline: one-level simulated (else predicted), two-level predicted
                # (no simulation of it), pipeline-only simulated
                base = [x for x in (r["one_sim"] or r["one"], r["two"],
                                    r["only"] and r["only"][0]) if x]
                pick = r["joint"]
                lead = f"{min(base) / pick[0]:.2f}x" if pick and base else "-"
                pick_text = (f"P={pick[1]} {pick[2].replace(' 2L', '+2L')} m={pick[3]} "
                             f"{r['schedule'] or ''}" if pick else "none")
                made = f"{r['made'][0]}/{r['made'][1]}" if r["made"] else "-"
                search = f"{r['search']:.2f} s" if r["search"] is not None else "-"
                if r["search"] is not None:
                    series.setdefault(model, []).append((n, r["search"]))
                one = f"{text(r['one'])} / {text(r['one_sim'])}"
                print(f"{model:>10} {n:>7} {one:>21} {text(r['two']):>10} "
                      f"{text(r['only'] and r['only'][0]):>10} {pick_text:>20} "
                      f"{text(pick and pick[5]):>10} {text(pick and pick[0]):>10} "
                      f"{(f'{pick[4]:.1f}%' if pick else '-'):>7} {lead:>6} {search:>8} "
                      f"{wall:>6.1f} s {peak / 1024:>5.0f}  {made}"
                      + ("" if rc == 0 else f"  (exit {rc}: {out.strip().splitlines()[-1]})"),
                      flush=True)
    if a.svg and series:
        scale.svg(series, a.svg)
        with open(a.svg) as f:
            body = f.read().replace("synthesis time (log-log)",
                                    "pipeline search time (log-log)")
        with open(a.svg, "w") as f:
            f.write(body)
        print(f"wrote {a.svg}")


if __name__ == "__main__":
    sys.exit(main())
