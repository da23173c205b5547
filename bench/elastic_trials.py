#!/usr/bin/env python3
"""Lose a device, keep training: trials of hspmd-run on an emulated 3-device cluster (5:3:1).
Each trial kills one rank with SIGKILL (HSPMD_FAULT kind kill) at a seeded random step and
rank, and checks that the job finishes on the 2 devices left, how many completed steps were
lost, and that the losses equal the program run by hand generation by generation (each
generation resuming the state the last one saved, on the cluster file hspmd-run wrote). It
prints a row per trial and the recovery time (the kill to the next completed step) broken down:
  detect  the kill to the job's end as hspmd-run sees it (Open MPI ends the job)
  launch  hspmd-run relaunching to the new job's start record, less planning and loading
          (mpirun, MPI_Init, tracing the model, calibration-free start-up)
  plan    the new job's planning for the 2 devices (the start record's plan_ms)
  load    the new job's checkpoint load, resharded (the start record's load_ms)
  step    the start record to the first completed step

    python3 bench/elastic_trials.py --trials 10 --seed 47 --build build/release -- \\
        --layers 2 --hidden 256 --ffn 1024 --heads 4 --seq 64 --batch 16 --vocab 2000 \\
        --steps 30

The arguments after -- go to examples/bert (with --save-every 1, --checkpoint-dir and
--metrics added). With --ram, the state is kept in the RAM tier after every step (--ram-dir
under /dev/shm) and saved to disk every 10 steps. Needs a built hspmd-run and bert (cmake
--build --preset release)."""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def mpirun_flags():
    flags = ["--oversubscribe"]
    return flags + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def losses(recs):
    by_step = {}
    for r in recs:
        if "step" in r:
            by_step[r["step"]] = r["loss"]
    return by_step


def trial(a, program, step, rank, work):
    run_dir = os.path.join(work, "run")
    ck = os.path.join(work, "ck")
    metrics = os.path.join(work, "metrics.jsonl")
    launcher = [os.path.join(a.build, "tools", "hspmd-run"), "--cluster", a.cluster,
                "--run-dir", run_dir, "--mpirun", "mpirun", "--backoff", "0",
                "--timeout", "10", "--fault", f"0:rank:{rank},at:step{step},kind:kill"]
    launcher += [f"--mpirun-arg={f}" for f in mpirun_flags()]
    ram = ["--ram-dir", tempfile.mkdtemp(prefix="hspmd-ram-", dir="/dev/shm")] if a.ram else []
    out = subprocess.run(launcher + ["--"] + program + ["--checkpoint-dir", ck, "--metrics",
                                                        metrics] + ram,
                         capture_output=True, text=True, check=False)
    if ram:
        subprocess.run(["rm", "-rf", ram[1]], check=False)
    finished = out.returncode == 0 and "finished on 2 device(s)" in out.stdout
    recs = records(metrics)
    member = [r for r in recs if r.get("event") == "membership"]
    starts = [r for r in recs if r.get("event") == "start"]
    if not finished or len(member) != 1 or len(starts) != 2:
        sys.exit(f"trial (kill rank {rank} at step {step}) did not finish on 2 devices:\n"
                 f"{out.stdout[-3000:]}\n{out.stderr[-2000:]}")
    m = member[0]
    s1 = starts[1]
    before = [r for r in recs if "step" in r and r["t"] < m["t"]]
    completed = max(r["step"] for r in before) if before else 0
    first_after = min((r for r in recs if "step" in r and r["t"] > s1["t"]),
                      key=lambda r: r["t"])
    plan = s1.get("plan_ms", 0.0) / 1e3
    load = s1.get("load_ms", 0.0) / 1e3
    t = {
        "detect": m["ended_at"] - m["failed_at"],
        "launch": s1["t"] - m["relaunch_at"] - plan - load,
        "plan": plan,
        "load": load,
        "step": first_after["t"] - s1["t"],
        "recovery": first_after["t"] - m["failed_at"],
    }
    # The reference: generation 0 by hand to the step the elastic run resumed from (saved there
    # as its last), then generation 1 on the cluster hspmd-run wrote, resuming.
    ref_ck = os.path.join(work, "ref-ck")
    ref_metrics = os.path.join(work, "ref.jsonl")
    at = program.index("--steps") + 1
    steps = int(program[at])
    for gen, (end, ranks) in enumerate([(s1["resumed_from"], 3), (steps, 2)]):
        until = program[:at] + [str(end)] + program[at + 1:]
        cmd = ["mpirun"] + mpirun_flags() + ["-np", str(ranks)] + until + [
            "--checkpoint-dir", ref_ck, "--metrics", ref_metrics,
            "--cluster", os.path.join(run_dir, f"cluster-gen{gen}.json")]
        cmd += ["--resume"] if gen > 0 else []
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            sys.exit(f"reference generation {gen} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    got, want = losses(recs), losses(records(ref_metrics))
    worst = max(abs(got[s] - want[s]) / max(abs(want[s]), 1e-30) for s in want)
    if sorted(got) != sorted(want):
        sys.exit(f"steps differ: {sorted(got)} vs {sorted(want)}")
    return {"step": step, "rank": rank, "lost": completed - s1["resumed_from"],
            "resumed_from": s1["resumed_from"], "worst": worst, **t}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seed", type=int, default=47)
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--cluster", default="clusters/emulated-3.json")
    ap.add_argument("--model", default="bert", help="an example program of the build")
    ap.add_argument("--ram", action="store_true",
                    help="the RAM tier after every step, the disk every 10 steps")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    extra = a.args[1:] if a.args and a.args[0] == "--" else a.args
    if "--steps" not in extra:
        extra += ["--steps", "30"]
    program = [os.path.join(a.build, "examples", a.model)] + extra + [
        "--save-every", "10" if a.ram else "1"]
    steps = int(extra[extra.index("--steps") + 1])
    rng = random.Random(a.seed)
    rows = []
    print(f"{'trial':>5} {'kill':>12} {'resumed':>7} {'lost':>4} {'max rel diff':>12} "
          f"{'detect':>7} {'launch':>7} {'plan':>6} {'load':>6} {'step':>6} {'recovery':>8}")
    for i in range(a.trials):
        step = rng.randint(3, steps - 3)
        rank = rng.randint(0, 2)
        with tempfile.TemporaryDirectory(prefix="hspmd-elastic-") as work:
            r = trial(a, program, step, rank, work)
        rows.append(r)
        print(f"{i + 1:>5} {'rank ' + str(rank) + ' @' + str(step):>12} {r['resumed_from']:>7} "
              f"{r['lost']:>4} {r['worst']:>12.2e} {r['detect']:>7.2f} {r['launch']:>7.2f} "
              f"{r['plan']:>6.3f} {r['load']:>6.3f} {r['step']:>6.3f} {r['recovery']:>8.2f}",
              flush=True)
    med = {k: statistics.median(r[k] for r in rows)
           for k in ("detect", "launch", "plan", "load", "step", "recovery")}
    print(f"{len(rows)} trials: every one finished on 2 devices; steps lost at most "
          f"{max(r['lost'] for r in rows)}; largest relative loss difference "
          f"{max(r['worst'] for r in rows):.2e}")
    print("median seconds: " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))


if __name__ == "__main__":
    main()
