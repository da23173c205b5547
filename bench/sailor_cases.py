#!/usr/bin/env python3
"""Sailor's heterogeneous cases planned by hspmd, and hspmd's plans under Sailor's simulator.

    python3 bench/sailor_cases.py [--sizes 32:96,80:240,128:384] [--sailor DIR] [-- hspmd-plan flags]

Sailor (eth-easl/sailor, SOSP'25) evaluates its planner on A100-40 + V100-16 clusters (1:3, four
GPUs a node, one zone) training OPT-350M (24 layers, hidden 1024, 16 heads, sequence 2048,
vocabulary 50272, global batch 1024, fp32, Adam). This script writes each case as an hspmd
cluster file and plans it with `hspmd-plan --hierarchical --pipeline auto --simulate` (bert at
OPT-350M's sizes: the same pre-norm decoder with learned positions; GELU for ReLU changes no
FLOPs). The cluster's numbers come from Sailor's own inputs, so both sides price the same
hardware:

  speed     each kind's measured time of one OPT-350M layer (forward + backward, micro-batch 1,
            no tensor parallelism) in Sailor's profile: A100-40 8.692 ms, V100-16 24.987 ms,
            turned into flop/s with the 206.2 GFLOP hspmd counts for that layer
  links     Sailor's simulator prices every transfer on its inter-node fits (its intra-node
            table is loaded but not used): a 4-GPU VM to another 5.5-6.0 GB/s; hspmd gets
            6 GB/s between nodes and, within a node, V100's 68 GB/s (one intra-node link per
            cluster file: the slower kind's)
  memory    40 GiB and 16 GiB
  attention fused (no (S, S) scores kept): Sailor's activation memory per layer (its llm_info,
            90.2 M floats a sequence) holds no scores either

With --sailor DIR (a checkout of Sailor's repository; DIR/sailor/Planner/... must exist) the
script also evaluates, under Sailor's simulator (its `Simulator.simulate_iteration_time`, run on
numpy with empty stand-ins for the torch and pandas modules it imports but does not call there),
what of hspmd's plans Sailor's plan format can express:

  dp-ev        one stage, every GPU a data-parallel replica of 1024 / n rows (hspmd's DP-EV;
               the largest profiled micro-batch up to it, 2 rows on 320 GPUs)
  pipeline     hspmd's chosen pipeline as stages of data-parallel replicas, its layer cuts and
               its micro-batch rows per device, where that count is one Sailor profiled
               (1, 2, 4, 8) and every stage has as many devices; hspmd's uneven shares and
               per-tensor splits inside a stage are not expressible and are dropped
  equal P      the same depth with equal groups (hspmd-plan --pipeline P), which Sailor's format
               can hold: both simulators on one plan (hspmd's simulated step beside Sailor's)

With --sailor-picks DIR (Sailor's own planner's picks, run apart: its C++ planner built from its
repository, result_a{A}_v{V}.json each holding its `top_plan`) the script prints Sailor's pick,
its planner's estimate and its simulator's step beside hspmd's simulated step of the same
layout: the devices Sailor uses in its stages' order, its layer cuts, the most micro-batches
that divide the batch with at least Sailor's rows each, and hspmd's programs inside the stages (Sailor's
replicas of tensor degree 4 are hspmd's to plan, not a TP-4 program forced).
"""
import argparse
import importlib.util
import io
import contextlib
import json
import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("pipeline_scale",
                                               os.path.join(ROOT, "bench", "pipeline_scale.py"))
ps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ps)

LAYER_FLOP = 206.2e9  # one OPT-350M layer, forward + backward, one sequence (hspmd's count)
KINDS = {"A100-40": (LAYER_FLOP / 8.692e-3, "40 GiB"), "V100-16": (LAYER_FLOP / 24.987e-3, "16 GiB")}
MODEL = ["--model", "bert", "--layers", "24", "--hidden", "1024", "--heads", "16", "--ffn",
         "4096", "--seq", "2048", "--vocab", "50272", "--batch", "1024", "--fused-attention"]


def cluster(a100, v100, path):
    devices = []
    node = 0
    for kind, count in (("A100-40", a100), ("V100-16", v100)):
        speed, memory = KINDS[kind]
        for _ in range(count // 4):
            devices.append({"name": f"{kind.lower()}-{node}", "kind": kind, "speed": speed,
                            "memory": memory, "node": node, "count": 4})
            node += 1
    with open(path, "w") as f:
        json.dump({"version": 1, "name": f"sailor-{a100}-{v100}",
                   "description": "Sailor's A100-40 + V100-16 case, speeds from its profile",
                   "links": {"intra_node": {"bandwidth": 6.8e10, "latency": 5e-6},
                             "inter_node": {"bandwidth": 6e9, "latency": 2e-5}},
                   "devices": devices}, f)
    return [d["kind"] for d in devices for _ in range(4)]


def sailor_simulator(root):
    """Sailor's simulator for OPT-350M, or None."""
    planner = os.path.join(root, "sailor", "Planner")
    if not os.path.isdir(planner):
        return None
    stubs = tempfile.mkdtemp()
    for mod in ("torch", "pandas"):  # imported at module level, not called by the simulator
        os.makedirs(os.path.join(stubs, mod))
        open(os.path.join(stubs, mod, "__init__.py"), "w").close()
    sys.path[:0] = [stubs, root]
    from sailor.Planner.simulations.runtime_simulator import Simulator
    sim = os.path.join(planner, "simulations")
    with open(os.path.join(sim, "configs", "training_config_opt_350.json")) as f:
        tc = json.load(f)
    with open(os.path.join(planner, "llm_info.json")) as f:
        llm = json.load(f)
    with open(os.path.join(sim, "profiles_tmp.json")) as f:
        prof = json.load(f)
    return Simulator(os.path.dirname(root), tc, llm, False, prof, "us-central1-a")


def sailor_time(sim, plan):
    """(fits, iteration seconds) of a Sailor plan dict."""
    with contextlib.redirect_stdout(io.StringIO()):
        fits = sim.check_config_fits(plan)
        t, _, _ = sim.simulate_iteration_time(plan)
    return fits, t


def replica(kind):
    return [[(kind, 1, "us-central1-a")], 1]


def dp_plan(kinds):
    n = len(kinds)
    # the largest profiled micro-batch up to 1024 / n rows (Sailor then runs
    # ceil(1024 / (mbs n)) of them: 1280 rows on 320 GPUs)
    mbs = max(m for m in (1, 2, 4, 8) if m <= max(1, 1024 // n))
    return {"mbs": mbs, "pipeline_list": [{
        "num_stages": 1, "layers_per_stage": [list(range(26))], "dp": [n],
        "tmp_per_stage": [[replica(k) for k in kinds]]}]}


def pipeline_as_sailor(pp, kinds, names):
    """hspmd's pipeline plan as stages of data-parallel replicas, or (None, why)."""
    sizes = pp["group_sizes"]
    if any("two_level" in st for st in pp["stages"]):
        return None, "two-level stages"
    if len(set(sizes)) != 1:
        return None, "uneven groups"
    rows = 1024 // pp["micro"]
    if rows % sizes[0] or rows // sizes[0] not in (1, 2, 4, 8):
        return None, f"{rows} rows a micro-batch over {sizes[0]} devices"
    first = pp["first_blocks"] + [24]
    layers = [list(range(first[s] + 1, first[s + 1] + 1)) for s in range(len(sizes))]
    layers[0].insert(0, 0)
    layers[-1].append(25)
    index = {name: i for i, name in enumerate(names)}
    stages = [[replica(kinds[index[d]]) for d in st["cluster"]["devices"]] for st in pp["stages"]]
    return {"mbs": rows // sizes[0], "pipeline_list": [{
        "num_stages": len(sizes), "layers_per_stage": layers, "dp": sizes,
        "tmp_per_stage": stages}]}, ""


def sailor_pick_in_hspmd(top, path):
    """Sailor's planner's pick (`top`: its plan dict) as an hspmd cluster file written to `path`
    -- the devices it uses, in its stages' order (a V100 replica of tensor degree 4 is one
    4-GPU node; A100 replicas of degree 1 packed four to a node in stage order) -- and the
    hspmd-plan flags of its layout: the groups' sizes, each stage's first block (Sailor's layer
    0 is the embedding, 1-24 the blocks, 25 the head) and the most micro-batches that divide the
    batch with at least Sailor's rows each (Sailor rounds the batch up: ceil(1024 / (mbs x dp))
    micro-batches of mbs x dp rows; fewer rows than a group's nodes would leave nodes idle)."""
    pl = top["pipeline_list"][0]
    devices, sizes, node, a100_in_node = [], [], -1, 4
    for replicas in pl["tmp_per_stage"]:
        count = 0
        for r in replicas:
            kind, tp = r[0][0][0], r[1]
            for i in range(tp):
                if (tp > 1 and i == 0) or (tp == 1 and a100_in_node == 4):  # a new node
                    node += 1
                    a100_in_node = 0
                if tp == 1:
                    a100_in_node += 1
                speed, memory = KINDS[kind]
                devices.append({"name": f"{kind.lower()}-{node}.{len(devices)}", "kind": kind,
                                "speed": speed, "memory": memory, "node": node})
                count += 1
            if tp == 4:
                a100_in_node = 4  # (the next A100 starts a node)
        sizes.append(count)
    with open(path, "w") as f:
        json.dump({"version": 1, "name": "sailor-pick",
                   "description": "the devices of Sailor's pick, in its stages' order",
                   "links": {"intra_node": {"bandwidth": 6.8e10, "latency": 5e-6},
                             "inter_node": {"bandwidth": 6e9, "latency": 2e-5}},
                   "devices": devices}, f)
    first = [0] + [layers[0] - 1 for layers in pl["layers_per_stage"][1:]]
    rows = top["mbs"] * pl["dp"][0]
    micro = max(m for m in range(1, 1025) if 1024 % m == 0 and 1024 // m >= rows)
    return sizes, first, micro


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="32:96,80:240,128:384")
    ap.add_argument("--sailor", help="a checkout of eth-easl/sailor (its simulator is run)")
    ap.add_argument("--sailor-picks",
                    help="a folder of Sailor's planner's picks (result_a{A}_v{V}.json, each "
                         "with its top_plan): their layouts planned by hspmd beside")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    sim = sailor_simulator(a.sailor) if a.sailor else None
    if a.sailor_picks:
        return sailor_picks(a, sim)
    if a.sailor and sim is None:
        print(f"{a.sailor}: no sailor/Planner in it; hspmd's side only")
    tool = os.path.join(ROOT, "build/release/tools/hspmd-plan")
    text = ps.text
    print(f"{'A100+V100':>10} {'hspmd one-level':>21} {'two-level':>10} {'pipeline pick':>22} "
          f"{'simulated':>10} {'search':>8} | Sailor sim: {'dp-ev':>9} {'pipeline':>9} | "
          f"equal P, m: hspmd sim / Sailor sim")
    with tempfile.TemporaryDirectory() as d:
        for case in a.sizes.split(","):
            a100, v100 = (int(x) for x in case.split(":"))
            path = os.path.join(d, f"c{a100}.json")
            kinds = cluster(a100, v100, path)
            names = [f"{k.lower()}-{i // 4}.{i % 4}" for i, k in enumerate(kinds)]
            out_json = os.path.join(d, f"p{a100}.json")
            cmd = [tool] + MODEL + ["--cluster", path, "--no-baselines", "--hierarchical",
                                    "--pipeline", "auto", "--simulate", "--json",
                                    out_json] + a.extra
            rc, out, wall, _ = ps.scale.run(cmd)
            r = ps.parse(out)
            pick = r["joint"]
            pick_text = f"P={pick[1]} {pick[2]} m={pick[3]}" if pick else "none"
            sailor_dp = sailor_pp = "-"
            if sim is not None:
                fits, t = sailor_time(sim, dp_plan(kinds))
                sailor_dp = text(t) + ("" if fits else " OOM")
                if rc == 0 and os.path.exists(out_json):
                    with open(out_json) as f:
                        plan, why = pipeline_as_sailor(json.load(f), kinds, names)
                    if plan:
                        fits, t = sailor_time(sim, plan)
                        sailor_pp = text(t) + ("" if fits else " OOM")
                    else:
                        sailor_pp = f"({why})"
            equal = "-"
            if pick:
                eq_json = os.path.join(d, f"e{a100}.json")
                cmd = [tool] + MODEL + ["--cluster", path, "--no-baselines", "--pipeline",
                                        str(pick[1]), "--micro", str(pick[3]), "--simulate",
                                        "--stage-programs", "one-level", "--json",
                                        eq_json] + a.extra
                erc, eout, _, _ = ps.scale.run(cmd)
                m = re.search(r"^sim +(\S+ \S+)", eout, re.M)
                equal = f"P={pick[1]} m={pick[3]}: " + (text(ps.seconds(m.group(1))) if m
                                                        else "no plan")
                if sim is not None and erc == 0:
                    with open(eq_json) as f:
                        plan, why = pipeline_as_sailor(json.load(f), kinds, names)
                    if plan:
                        fits, t = sailor_time(sim, plan)
                        equal += " / " + text(t) + ("" if fits else " OOM")
                    else:
                        equal += f" / ({why})"
            one = f"{text(r['one'])} / {text(r['one_sim'])}"
            print(f"{a100:>4}+{v100:<5} {one:>21} {text(r['two']):>10} {pick_text:>22} "
                  f"{text(pick and pick[0]):>10} {text(r['search']):>8} | "
                  f"{sailor_dp:>20} {sailor_pp:>9} | {equal}"
                  + ("" if rc == 0 else f"  (exit {rc}: {out.strip().splitlines()[-1]})"),
                  flush=True)


def sailor_picks(a, sim):
    """Sailor's own picks: its planner's estimate, its simulator's step, and hspmd's simulated
    step of the same layout (groups, cuts, micro-batch rows) with hspmd's stage programs."""
    tool = os.path.join(ROOT, "build/release/tools/hspmd-plan")
    text = ps.text
    print(f"{'A100+V100':>10} {'Sailor pick':>34} {'estimate':>9} {'Sailor sim':>11} | "
          f"{'hspmd sim, same layout':>24} {'m':>4}")
    with tempfile.TemporaryDirectory() as d:
        for case in a.sizes.split(","):
            a100, v100 = (int(x) for x in case.split(":"))
            with open(os.path.join(a.sailor_picks, f"result_a{a100}_v{v100}.json")) as f:
                top = json.load(f)["top_plan"]
            pl = top["pipeline_list"][0]
            shape = (f"{pl['num_stages']} stages, dp {pl['dp'][0]}, mbs {top['mbs']}, "
                     f"layers {'/'.join(str(len(x)) for x in pl['layers_per_stage'])}")
            ssim = "-"
            if sim is not None:
                fits, t = sailor_time(sim, top)
                ssim = text(t) + ("" if fits else " OOM")
            path = os.path.join(d, f"s{a100}.json")
            sizes, first, micro = sailor_pick_in_hspmd(top, path)
            cmd = [tool] + MODEL + ["--cluster", path, "--no-baselines", "--pipeline",
                                    ",".join(map(str, sizes)), "--micro", str(micro),
                                    "--first-blocks", ",".join(map(str, first)),
                                    "--simulate"] + a.extra
            rc, out, _, _ = ps.scale.run(cmd)
            m = re.search(r"^sim +(\S+ \S+)", out, re.M)
            hsim = text(ps.seconds(m.group(1))) if m else (
                f"no plan ({out.strip().splitlines()[-1][:80]})" if out.strip() else "no plan")
            print(f"{a100:>4}+{v100:<5} {shape:>34} {text(top['iter_time']):>9} {ssim:>11} | "
                  f"{hsim:>24} {micro:>4}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
