#!/usr/bin/env python3
"""What reading the data costs a language-model step (docs/data.md, docs/benchmarks.md).

Runs examples/llama (Llama-small: 2 x 256, FFN 688, seq 64, batch 16, vocabulary 8192) at np 2
on two emulated devices with --trace, once per data source -- the seeded synthetic text, a text
file (tokenized at start), a flat uint16 file and a Megatron-LM .bin/.idx pair (the last two
written by scripts/make_token_data.py from the same text) -- and reports from each rank's trace
the time of the "input" spans (the feed: a prefetched batch handed to the executor) against the
"step" spans, steps 4.. of --steps.

    python3 bench/input_share.py [--build build/release] [--text ../shared/data/wikitext-2/valid.txt]
                                 [--steps 30] [--rounds 3]

Builds nothing: cmake --build --preset release --target llama.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ["--layers", "2", "--hidden", "256", "--ffn", "688", "--heads", "4", "--seq", "64",
         "--vocab", "8192", "--batch", "16", "--no-calibrate", "--plan", "synth"]


def spans(trace):
    events = json.load(open(trace))
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    inputs, steps = {}, {}
    for e in events:
        if e.get("ph") != "X":
            continue
        pid = e.get("pid", 0)
        if e.get("name") == "input":
            inputs.setdefault(pid, []).append(e["dur"])
        elif str(e.get("name", "")).startswith("step "):
            steps.setdefault(pid, []).append(e["dur"])
    return inputs, steps


def run(args, data, d):
    trace = os.path.join(d, "trace.json")
    cmd = ["mpirun", "-np", "2", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    cmd += [os.path.join(args.build, "examples", "llama"), "--quiet", "--steps", str(args.steps),
            "--cluster", os.path.join(d, "two.json"), "--trace", trace] + MODEL + data
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("input_share.py: failed: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    inputs, steps = spans(trace)
    shares = []
    for pid in steps:
        i, s = inputs.get(pid, [])[3:], steps[pid][3:]
        shares.append(sum(i) / sum(s))
    return max(shares), statistics.median(steps[min(steps)][3:]) / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--text", default=os.path.join(ROOT, "..", "shared", "data", "wikitext-2",
                                                   "valid.txt"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        json.dump({"version": 1, "name": "two",
                   "links": {"intra_node": {"bandwidth": 5e9, "latency": 1e-6}},
                   "devices": [{"name": "cpu%d" % i, "kind": "cpu", "speed": 5e10,
                                "memory": "4 GiB"} for i in range(2)]},
                  open(os.path.join(d, "two.json"), "w"))
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_token_data.py"),
                        "--vocab", "8192", "--out", d, a.text], check=True, capture_output=True)
        name = os.path.splitext(os.path.basename(a.text))[0]
        sources = [("synthetic", []), ("text", ["--data", a.text]),
                   ("bin16", ["--data", os.path.join(d, name + ".bin")]),
                   ("megatron", ["--data", os.path.join(d, name + "-mmap.bin")])]
        got = {k: [] for k, _ in sources}
        for _ in range(a.rounds):
            for k, data in sources:
                got[k].append(run(a, data, d))
        for k, _ in sources:
            share = statistics.median(x[0] for x in got[k])
            step = statistics.median(x[1] for x in got[k])
            print("%-9s input %.3f %% of the step (the larger rank's; median of %d runs), step %.1f ms"
                  % (k, 100 * share, a.rounds, step))


if __name__ == "__main__":
    main()
