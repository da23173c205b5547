#!/usr/bin/env python3
"""hspmd-plan's pictures render (docs/synthesis.md, "Pictures").

    plan_svg_render.py HSPMD_PLAN CLUSTERS_DIR WORK_DIR

Draws a one-level plan of BERT on the mixed-8 cluster, its simulated step for two devices
(--simulate --gantt) and a pipeline plan on emulated-3 (--svg), renders them with Debian's rsvg-convert (librsvg2-bin) to PNG, and checks: the renderer
accepts them, the PNGs are non-empty and of sane size, and the one-level picture has one share
piece per device (a <title> "device: share" each). Exits 77 (skipped) without rsvg-convert.
"""
import os
import re
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True  # (no __pycache__ in the source tree)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svg_render import render, renderer  # noqa: E402

svg_tool = renderer()
plan, clusters, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
model = ["--model", "bert", "--layers", "4", "--hidden", "64", "--heads", "2", "--seq", "16",
         "--vocab", "128", "--no-baselines"]
runs = {
    "one-level": (["--cluster", os.path.join(clusters, "mixed-8.json"), "--batch", "32"], 8),
    "gantt": (["--cluster", os.path.join(clusters, "mixed-8.json"), "--batch", "32",
               "--simulate", "--gantt-devices", "a100.0,v100.0"], None),
    "pipeline": (["--cluster", os.path.join(clusters, "emulated-3.json"), "--batch", "8",
                  "--pipeline", "1,2", "--micro", "4"], None),
}
for name, (args, devices) in runs.items():
    svg = os.path.join(work, name + ".svg")
    flag = "--gantt" if name == "gantt" else "--svg"
    r = subprocess.run([plan] + model + args + [flag, svg], capture_output=True, text=True)
    print(r.stdout + r.stderr)
    if r.returncode != 0:
        sys.exit("plan_svg_render.py: hspmd-plan failed for %s" % name)
    render(svg, svg_tool)
    if name == "gantt":
        text = open(svg).read()
        for want in ("rank 0 (a100.0)", "rank 4 (v100.0)", "compute", "collectives"):
            if want not in text:
                sys.exit("plan_svg_render.py: %r not in %s" % (want, svg))
        if len(re.findall(r"<rect ", text)) < 20:
            sys.exit("plan_svg_render.py: %s draws fewer than 20 bars" % svg)
    if devices:
        text = open(svg).read()
        shares = re.findall(r"<title>([^<:]+): ([0-9.]+)</title>", text)
        if len(shares) != devices:
            sys.exit("plan_svg_render.py: %d share pieces in %s, expected %d" % (len(shares), svg,
                                                                                devices))
print("the three pictures render")
