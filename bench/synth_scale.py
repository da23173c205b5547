#!/usr/bin/env python3
"""Synthesis time and memory against the device count.

    python3 bench/synth_scale.py [--devices 64,256,1024,4096] [--model bert,llama-7b,...]
                                 [--layers N] [--batch-fraction F] [--baselines] [--hierarchical]
                                 [--svg out.svg]
                                 [-- extra hspmd-plan flags]

Builds nothing: run `cmake --build --preset release --target hspmd-plan` first. For each count n
it writes a cluster of n/8 nodes of 8 GPUs, a quarter of the nodes each H100, A100, V100 and T4
(speeds 4e14, 1.5e14, 6e13, 2.5e13 flop/s), 2.4e11 B/s inside a node and 200 Gbit/s between
nodes, runs hspmd-plan on it and prints the synthesis time hspmd-plan reports (search, LP), the
whole run's wall time and peak memory, and the synthesized plan's predicted step, or why no plan
fits. With --hierarchical it also prints the two-level plan (hspmd-plan --hierarchical): its
synthesis time, predicted step, and the one-level plan's step over it. With --svg it also plots
each model's synthesis time against devices (log-log, one line per model).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = [("h100", "H100", 4e14, "80 GiB"), ("a100", "A100", 1.5e14, "80 GiB"),
         ("v100", "V100", 6e13, "32 GiB"), ("t4", "T4", 2.5e13, "16 GiB")]


def cluster(n, path):
    nodes = n // 8
    devices = []
    for node in range(nodes):
        name, kind, speed, memory = KINDS[node * 4 // nodes]
        devices.append({"name": f"{name}-{node}", "kind": kind, "speed": speed,
                        "memory": memory, "node": node, "count": 8})
    with open(path, "w") as f:
        json.dump({"version": 1, "name": f"scale-{n}",
                   "links": {"intra_node": {"bandwidth": 2.4e11, "latency": 2e-6},
                             "inter_node": {"bandwidth": 2.5e10, "latency": 1e-5}},
                   "devices": devices}, f)


def run(cmd):
    """Runs cmd; returns (exit code, output, wall seconds, its own peak RSS in KiB)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, out, time.perf_counter() - t0, usage.ru_maxrss


COLORS = ["steelblue", "darkorange", "seagreen", "firebrick", "purple"]


def svg(series, path):
    """series: {model: [(devices, seconds), ...]}, one line per model (log-log)."""
    import math
    w, h, pad = 520, 340, 55
    pts_all = [p for rows in series.values() for p in rows]
    xs_all = [math.log10(p[0]) for p in pts_all]
    ys_all = [math.log10(max(p[1], 1e-3)) for p in pts_all]
    x0, x1 = min(xs_all), max(xs_all)
    y0, y1 = math.floor(min(ys_all)), math.ceil(max(ys_all))
    if y1 == y0:
        y1 += 1

    def px(x, y):
        return (pad + (x - x0) / (x1 - x0 or 1) * (w - 2 * pad),
                h - pad - (y - y0) / (y1 - y0) * (h - 2 * pad))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-size="11">',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>']
    ticks = sorted({p[0] for p in pts_all})
    for n in ticks:
        a, _ = px(math.log10(n), y0)
        parts.append(f'<text x="{a:.1f}" y="{h - pad + 15}" text-anchor="middle">{n}</text>')
    for k, (model, rows) in enumerate(series.items()):
        color = COLORS[k % len(COLORS)]
        xy = [px(math.log10(n), math.log10(max(t, 1e-3))) for n, t in rows]
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in xy)
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for a, b in xy:
            parts.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>')
        parts.append(f'<text x="{pad + 10}" y="{pad + 14 * k}" fill="{color}">{model}</text>')
    for e in range(y0, y1 + 1):
        a, b = px(x0, e)
        parts.append(f'<text x="{pad - 5}" y="{b + 4:.1f}" text-anchor="end">{10 ** e:g} s</text>')
    parts.append(f'<text x="{w / 2}" y="{h - 10}" text-anchor="middle">devices</text>')
    parts.append(f'<text x="{w / 2}" y="20" text-anchor="middle">synthesis time (log-log)</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", default="64,256,1024,4096")
    ap.add_argument("--model", default="bert",
                    help="one or more models or presets, comma-separated (e.g. bert,llama-7b); "
                         "model@F gives that model a batch of F times the device count")
    ap.add_argument("--layers", help="override the model's layer count")
    ap.add_argument("--baselines", action="store_true", help="also price DP-EV, DP-CP and TP")
    ap.add_argument("--hierarchical", action="store_true",
                    help="also synthesize the two-level plan and compare")
    ap.add_argument("--batch-fraction", type=float,
                    help="batch = this fraction of the device count (e.g. 0.21875 = 7/32)")
    ap.add_argument("--svg")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    tool = os.path.join(ROOT, "build/release/tools/hspmd-plan")
    series = {}
    print(f"{'model':>10} {'devices':>8} {'synthesis':>10} {'search':>8} {'LP':>8} {'run':>8} "
          f"{'peak MiB':>9}  predicted step")
    with tempfile.TemporaryDirectory() as d:
        for spec in a.model.split(","):
            # "model@F": this model's batch is F times the device count (else --batch-fraction)
            model, _, own = spec.partition("@")
            fraction = float(own) if own else a.batch_fraction
            for n in (int(x) for x in a.devices.split(",")):
                path = os.path.join(d, f"c{n}.json")
                cluster(n, path)
                cmd = [tool, "--model", model, "--cluster", path] + a.extra
                if a.layers:
                    cmd += ["--layers", a.layers]
                if fraction:
                    cmd += ["--batch", str(max(1, round(n * fraction)))]
                if not a.baselines:
                    cmd.append("--no-baselines")
                if a.hierarchical:
                    cmd.append("--hierarchical")
                rc, out, wall, peak = run(cmd)
                two = re.search(r"two-level plan \((\S+)\): .*synthesized in ([0-9.]+) s", out)
                two_step = re.search(r"^two-lvl +(\S+ \S+) +(\S+ \S+) +(\S+ \S+) +([0-9.]+)x",
                                     out, re.M)
                two_text = ""
                if a.hierarchical:
                    if two and two_step:
                        vs = (f", one-level / two-level {two_step.group(4)}x"
                              if float(two_step.group(4)) > 0 else ", no one-level plan")
                        two_text = (f"\n{'':>10} {'':>8} {two.group(2):>8} s  two-level "
                                    f"({two.group(1)}): step {two_step.group(1)} (slowest node "
                                    f"{two_step.group(2)}, across {two_step.group(3)}){vs}")
                    else:
                        err = (re.search(r"two-level plan: none \(the one-level plan stands\): "
                                         r"(.*)", out) or re.search(r"hspmd-plan: (.*)", out))
                        two_text = (f"\n{'':>10} {'':>8} {'-':>10}  two-level: "
                                    f"{err.group(1) if err else out.strip().splitlines()[-1]}")
                m = re.search(r"synthesis: ([0-9.]+) s \(search ([0-9.]+) s.*LP ([0-9.]+) s\)", out)
                if rc != 0 or not m:
                    why = (re.search(r"one-level synthesis: no plan: .*?no plan fits in memory: "
                                     r"(.*?) \(use", out) or
                           re.search(r"no plan fits in memory: (.*?) \(use", out))
                    print(f"{model:>10} {n:>8} {'-':>10} {'-':>8} {'-':>8} {wall:>6.2f} s "
                          f"{peak / 1024:>9.0f}  no plan: "
                          f"{why.group(1) if why else out.strip().splitlines()[-1]}{two_text}",
                          flush=True)
                    continue
                step = re.search(r"^synth +(\S+ \S+)", out, re.M)
                series.setdefault(model, []).append((n, float(m.group(1))))
                print(f"{model:>10} {n:>8} {m.group(1):>8} s {m.group(2):>6} s {m.group(3):>6} s "
                      f"{wall:>6.2f} s {peak / 1024:>9.0f}  {step.group(1) if step else '?'}"
                      f"{two_text}", flush=True)
    if a.svg and series:
        svg(series, a.svg)
        print(f"wrote {a.svg}")


if __name__ == "__main__":
    sys.exit(main())
