#!/usr/bin/env python3
"""hspmd next to PyTorch on the CPU: the same models, sizes, data shapes and optimizer, timed in
alternation (A B A B ...), one thread per process; prints the medians and ratios.

    python3 bench/vs_pytorch.py [--build build/release] [--rounds 5] [--steps 12] [--only NAME]
                                [--clean-env]

--clean-env runs hspmd as a new user would: every BLAS variable (OPENBLAS_CORETYPE,
OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, GOTO_NUM_THREADS, HSPMD_BLAS_CORE) removed from its
environment, so hspmd chooses the kernel set and the one thread per rank itself. The BLAS line
hspmd prints at start-up is shown either way.

Comparisons (each a name for --only):
  single-bert   one process, BERT-small LM (2 layers, hidden 256, FFN 3072, seq 64, vocab 2000)
  single-llama  one process, Llama-small LM (2 layers, hidden 256, SwiGLU 688, seq 64, vocab 2000)
  ddp           2 equal ranks: hspmd DP-EV vs PyTorch DDP (gloo), BERT-small
  emulated      2 ranks, rank 1 emulated 2x slower (every op's compute stretched, as hspmd's
                cluster file says): hspmd synth (calibrated) and DP-EV vs DDP at the best
                hand-set batch split
  gpu-bert-base one process on GPU 0 (--device cuda), BERT-base (12 layers, hidden 768, FFN
                3072, 12 heads, seq 128, vocab 30522, batch 32), in --precision f32 (PyTorch:
                float32, TF32 off, its default) or bf16 (PyTorch: autocast to bfloat16); hspmd's
                --device cuda --precision P. Run by the GPU bundle (scripts/gpu-bundle.sh).

Global batch 16, Adam (lr 1e-3), clip 1.0, dropout 0.1 (BERT), mean cross-entropy. A round runs
each side once for --steps steps; a side's time is the median step after the first two. Ratios
are taken within a round and their median reported.

PyTorch is optional (pip install torch); without it the script says so and exits 0. `make test`
never runs this script.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

BERT = dict(layers=2, hidden=256, ffn=3072, heads=4, seq=64, vocab=2000, dropout=0.1)
LLAMA = dict(layers=2, hidden=256, ffn=688, heads=4, seq=64, vocab=2000)
BERT_BASE = dict(layers=12, hidden=768, ffn=3072, heads=12, seq=128, vocab=30522, dropout=0.1)
BATCH = 16
BASE_BATCH = 32
CONFIGS = {"bert": BERT, "llama": LLAMA, "bert-base": BERT_BASE}
EXECUTABLE = {"bert": "bert", "llama": "llama", "bert-base": "bert"}


# ----------------------------------------------------------------------------------------------
# hspmd side: the example binaries, timed by their own per-step metrics
# ----------------------------------------------------------------------------------------------

BLAS_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                  "GOTO_NUM_THREADS", "OPENBLAS_VERBOSE", "HSPMD_BLAS_CORE")


def hspmd_env(args):
    if args.clean_env:
        return {k: v for k, v in os.environ.items() if k not in BLAS_VARIABLES}
    return dict(os.environ, OPENBLAS_NUM_THREADS="1")


def mpirun_prefix(n, args):
    flags = ["--oversubscribe"]
    if os.geteuid() == 0:
        flags.append("--allow-run-as-root")
    if not args.clean_env:
        flags += ["-x", "OPENBLAS_NUM_THREADS=1"]
    return ["mpirun", "-np", str(n)] + flags


def blas_line(args):
    """The BLAS line hspmd prints at start-up, from a one-step run of a tiny model."""
    exe = os.path.join(args.build, "examples", "bert")
    r = subprocess.run([exe, "--steps", "1", "--layers", "1", "--hidden", "16", "--heads", "2",
                        "--seq", "8", "--vocab", "32", "--batch", "2"],
                       capture_output=True, text=True, env=hspmd_env(args))
    lines = [l for l in (r.stdout + r.stderr).splitlines()
             if l.startswith("BLAS:") or l.startswith("warning:")]
    return "\n".join(lines) if lines else "(no BLAS line printed)"


def model_flags(model):
    cfg = CONFIGS[model]
    flags = []
    for k, v in cfg.items():
        flags += ["--" + k.replace("_", "-"), str(v)]
    return flags


def run_hspmd(args, model, steps, ranks=1, cluster=None, plan=None, batch=BATCH, device=None):
    exe = os.path.join(args.build, "examples", EXECUTABLE[model])
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        cmd = [exe, "--quiet", "--steps", str(steps), "--batch", str(batch), "--clip", "1.0",
               "--lr", "1e-3", "--metrics", metrics] + model_flags(model)
        if cluster:
            cmd += ["--cluster", cluster, "--plan", plan or "synth"]
            if (plan or "synth") == "synth":
                # the synthesizer plans with measured op times and collectives (a few seconds
                # before the first step, not counted), as PyTorch's side gets its best split
                # from a timed sweep
                cmd += ["--calibrate"]
        if device:
            cmd += ["--device", device, "--precision", args.precision]
        if ranks > 1:
            cmd = mpirun_prefix(ranks, args) + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, env=hspmd_env(args))
        if r.returncode != 0:
            sys.exit("hspmd run failed: " + " ".join(cmd) + "\n" + r.stdout + r.stderr)
        seconds = [json.loads(line)["seconds"] for line in open(metrics)
                   if '"step"' in line and '"seconds"' in line]
    return statistics.median(seconds[2:]) if len(seconds) > 2 else statistics.median(seconds)


def cluster_file(tmp, name, slowdown):
    devices = []
    for i, s in enumerate([1.0, slowdown]):
        d = {"name": "cpu%d" % i, "kind": "cpu", "speed": 5e10 / s, "memory": "4 GiB", "node": 0}
        if s != 1.0:
            d["slowdown"] = s
        devices.append(d)
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump({"version": 1, "name": name, "description": "vs_pytorch.py",
                   "links": {"intra_node": {"bandwidth": 5e9, "latency": 1e-6}},
                   "devices": devices}, f)
    return path


# ----------------------------------------------------------------------------------------------
# PyTorch side: the same models, run in a child process (one thread each)
# ----------------------------------------------------------------------------------------------

TORCH_WORKER = r'''
import json, math, os, statistics, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
spec = json.loads(sys.argv[1])
rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
model_kind, cfg, steps = spec["model"], spec["cfg"], spec["steps"]
split = spec.get("split") or [spec["batch"] // world] * world
device = spec.get("device", "cpu")
if device == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default, said aloud
    torch.backends.cudnn.allow_tf32 = False
half = device == "cuda" and spec.get("precision") == "bf16"
def sync():
    if device == "cuda":
        torch.cuda.synchronize()
slowdown = spec.get("slowdowns", [1.0] * world)[rank]
local_batch = split[rank]
global_batch = sum(split)

# The emulated slower device: like hspmd's cluster "slowdown", every leaf module's forward and
# backward compute is stretched (busy wait for (s - 1) times what it took).
def stretch(seconds):
    if slowdown > 1.0:
        until = time.perf_counter() + seconds * (slowdown - 1.0)
        while time.perf_counter() < until:
            pass

def add_stretch(module):
    if slowdown <= 1.0:
        return
    for m in module.modules():
        if any(True for _ in m.children()):
            continue
        m.register_forward_pre_hook(lambda mod, inp: setattr(mod, "_t0", time.perf_counter()))
        m.register_forward_hook(lambda mod, inp, out: stretch(time.perf_counter() - mod._t0))
        m.register_full_backward_pre_hook(lambda mod, g: setattr(mod, "_b0", time.perf_counter()))
        m.register_full_backward_hook(lambda mod, gi, go: stretch(time.perf_counter() - mod._b0))

class CoreAttention(nn.Module):  # scores, causal softmax, dropout, context: one leaf
    def __init__(self, heads, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
    def forward(self, q, k, v):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1),
                          float("-inf"))
        p = F.dropout(torch.softmax(s, -1), self.dropout, self.training)
        return p @ v

class Rotary(nn.Module):
    def __init__(self, seq, d, base):
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))
        ang = torch.outer(torch.arange(seq).float(), inv)
        self.register_buffer("cos", ang.cos()[:, None, :], persistent=False)
        self.register_buffer("sin", ang.sin()[:, None, :], persistent=False)
    def forward(self, x):  # (B, S, heads, d): rotate pairs (2i, 2i+1)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * self.cos - b * self.sin, a * self.sin + b * self.cos), -1).flatten(-2)

class Attention(nn.Module):
    def __init__(self, c, bias, rotary):
        super().__init__()
        h = c["hidden"]
        self.heads = c["heads"]
        self.wq, self.wk = nn.Linear(h, h, bias=bias), nn.Linear(h, h, bias=bias)
        self.wv, self.wo = nn.Linear(h, h, bias=bias), nn.Linear(h, h, bias=bias)
        self.core = CoreAttention(c["heads"], c.get("dropout", 0.0))
        self.rope = Rotary(c["seq"], h // c["heads"], 10000.0) if rotary else None
    def forward(self, x):
        b, s, h = x.shape
        def heads(p, rotate):
            y = p(x).view(b, s, self.heads, h // self.heads)
            if rotate and self.rope is not None:
                y = self.rope(y)
            return y.transpose(1, 2)
        ctx = self.core(heads(self.wq, True), heads(self.wk, True), heads(self.wv, False))
        return self.wo(ctx.transpose(1, 2).reshape(b, s, h))

class BertBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c["hidden"]), nn.LayerNorm(c["hidden"])
        self.attn = Attention(c, True, False)
        self.fc1, self.fc2 = nn.Linear(c["hidden"], c["ffn"]), nn.Linear(c["ffn"], c["hidden"])
        self.act, self.drop1, self.drop2 = nn.GELU(), nn.Dropout(c["dropout"]), nn.Dropout(c["dropout"])
    def forward(self, x):
        x = x + self.drop1(self.attn(self.ln1(x)))
        return x + self.drop2(self.fc2(self.act(self.fc1(self.ln2(x)))))

class SwiGLU(nn.Module):
    def forward(self, g, u):
        return F.silu(g) * u

class LlamaBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(c["hidden"], eps=1e-6), nn.RMSNorm(c["hidden"], eps=1e-6)
        self.attn = Attention(c, False, True)
        self.gate = nn.Linear(c["hidden"], c["ffn"], bias=False)
        self.up = nn.Linear(c["hidden"], c["ffn"], bias=False)
        self.down = nn.Linear(c["ffn"], c["hidden"], bias=False)
        self.swiglu = SwiGLU()
    def forward(self, x):
        x = x + self.attn(self.n1(x))
        y = self.n2(x)
        return x + self.down(self.swiglu(self.gate(y), self.up(y)))

class LM(nn.Module):
    def __init__(self, kind, c):
        super().__init__()
        self.tok = nn.Embedding(c["vocab"], c["hidden"])
        self.pos = nn.Parameter(torch.randn(c["seq"], c["hidden"]) * 0.02) if kind == "bert" else None
        block = BertBlock if kind == "bert" else LlamaBlock
        self.blocks = nn.ModuleList(block(c) for _ in range(c["layers"]))
        self.norm = nn.LayerNorm(c["hidden"]) if kind == "bert" else nn.RMSNorm(c["hidden"], eps=1e-6)
        self.head = nn.Linear(c["hidden"], c["vocab"], bias=kind == "bert")
    def forward(self, tokens):
        h = self.tok(tokens)
        if self.pos is not None:
            h = h + self.pos
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))

torch.manual_seed(1)
model = LM(model_kind, cfg).to(device)
add_stretch(model)
if world > 1:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(7 + rank)
times = []
for step in range(steps):
    tokens = torch.randint(0, cfg["vocab"], (local_batch, cfg["seq"]), generator=g)
    targets = torch.randint(0, cfg["vocab"], (local_batch * cfg["seq"],), generator=g)
    tokens, targets = tokens.to(device), targets.to(device)
    if world > 1:
        dist.barrier()
    sync()
    t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=half):
        logits = model(tokens).view(-1, cfg["vocab"])
    # the mean over the global batch (DDP averages gradients over ranks: scale by world)
    loss = F.cross_entropy(logits.float(), targets, reduction="sum") * (world / (global_batch * cfg["seq"]))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    loss.item()  # hspmd reads the loss back every step too
    sync()
    took = time.perf_counter() - t0
    if world > 1:  # the step ends when the slowest rank is done
        t = torch.tensor([took])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        took = t.item()
    times.append(took)
if rank == 0:
    print(json.dumps({"median": statistics.median(times[2:])}))
if world > 1:
    dist.destroy_process_group()
'''


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_torch(args, model, steps, world=1, split=None, slowdowns=None, attempt=0, batch=BATCH,
              device=None):
    cfg = CONFIGS[model]
    spec = {"model": "bert" if model == "bert-base" else model, "cfg": cfg, "steps": steps,
            "batch": batch}
    if device:
        spec["device"] = device
        spec["precision"] = args.precision
    if split:
        spec["split"] = split
    if slowdowns:
        spec["slowdowns"] = slowdowns
    with tempfile.TemporaryDirectory() as tmp:
        worker = os.path.join(tmp, "worker.py")
        with open(worker, "w") as f:
            f.write(TORCH_WORKER)
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        procs = []
        for r in range(world):
            e = dict(env, RANK=str(r), WORLD_SIZE=str(world))
            procs.append(subprocess.Popen([sys.executable, worker, json.dumps(spec)], env=e,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        outs = [p.communicate() for p in procs]
        failed = [e for p, (o, e) in zip(procs, outs) if p.returncode != 0]
        if failed:
            if attempt < 2:  # gloo's rendezvous can fail on a busy machine: retry, say so
                print("  (PyTorch run failed, retrying: %s)" % failed[0].strip().splitlines()[-1],
                      flush=True)
                return run_torch(args, model, steps, world, split, slowdowns, attempt + 1,
                                 batch, device)
            sys.exit("PyTorch run failed:\n" + failed[0])
        return json.loads(outs[0][0].strip().splitlines()[-1])["median"]


# ----------------------------------------------------------------------------------------------

def alternate(rounds, sides):
    """sides: {name: thunk}; runs them in turn `rounds` times; returns {name: [seconds]}."""
    got = {k: [] for k in sides}
    for r in range(rounds):
        for k, f in sides.items():
            got[k].append(f())
        print("  round %d: %s" % (r + 1, ", ".join("%s %.1f ms" % (k, 1e3 * v[-1])
                                                   for k, v in got.items())), flush=True)
    return got


def report(title, got, pairs):
    print(title)
    for k, v in got.items():
        print("  %-28s median %8.1f ms/step  (%s)" % (k, 1e3 * statistics.median(v),
                                                     " ".join("%.1f" % (1e3 * x) for x in v)))
    for a, b in pairs:
        ratios = [x / y for x, y in zip(got[a], got[b])]
        print("  %s / %s = %.3f (median of %d per-round ratios; range %.3f-%.3f)" %
              (a, b, statistics.median(ratios), len(ratios), min(ratios), max(ratios)))
    print(flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--only", action="append",
                    choices=["single-bert", "single-llama", "ddp", "emulated", "gpu-bert-base"])
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                    help="gpu-bert-base's precision (both sides)")
    ap.add_argument("--clean-env", action="store_true",
                    help="run hspmd with no BLAS variable in its environment (as a new user)")
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("vs_pytorch.py: PyTorch is not installed (pip install torch); nothing to compare")
        return 0
    for exe in ("bert", "llama"):
        if not os.path.exists(os.path.join(args.build, "examples", exe)):
            sys.exit("vs_pytorch.py: %s has no examples/%s; build it first (cmake --build "
                     "--preset release)" % (args.build, exe))
    want = set(args.only or ["single-bert", "single-llama", "ddp", "emulated"])
    if want & {"ddp", "emulated"} and shutil.which("mpirun") is None:
        sys.exit("vs_pytorch.py: no mpirun on PATH (apt-get install openmpi-bin)")
    import torch
    print("hspmd vs PyTorch %s, %d rounds of %d steps, global batch %d%s" %
          (torch.__version__, args.rounds, args.steps, BATCH,
           ", hspmd with no BLAS variable set" if args.clean_env else ""), flush=True)
    print("hspmd's " + blas_line(args) + "\n", flush=True)
    s = args.steps
    if "gpu-bert-base" in want:
        if not torch.cuda.is_available():
            print("gpu-bert-base: PyTorch sees no GPU; nothing compared")
            return 77
        print("GPU: %s, precision %s, batch %d" % (torch.cuda.get_device_name(0), args.precision,
                                                    BASE_BATCH), flush=True)
        got = alternate(args.rounds, {
            "hspmd": lambda: run_hspmd(args, "bert-base", s, batch=BASE_BATCH, device="cuda"),
            "pytorch": lambda: run_torch(args, "bert-base", s, batch=BASE_BATCH, device="cuda")})
        report("one GPU, BERT-base %s" % args.precision, got, [("hspmd", "pytorch")])
    if "single-bert" in want:
        got = alternate(args.rounds, {"hspmd": lambda: run_hspmd(args, "bert", s),
                                      "pytorch": lambda: run_torch(args, "bert", s)})
        report("one process, BERT-small", got, [("hspmd", "pytorch")])
    if "single-llama" in want:
        got = alternate(args.rounds, {"hspmd": lambda: run_hspmd(args, "llama", s),
                                      "pytorch": lambda: run_torch(args, "llama", s)})
        report("one process, Llama-small", got, [("hspmd", "pytorch")])
    with tempfile.TemporaryDirectory() as tmp:
        if "ddp" in want:
            equal = cluster_file(tmp, "equal-2", 1.0)
            got = alternate(args.rounds, {
                "hspmd dp-ev": lambda: run_hspmd(args, "bert", s, 2, equal, "dp-ev"),
                "pytorch ddp": lambda: run_torch(args, "bert", s, 2)})
            report("2 equal ranks, BERT-small", got, [("hspmd dp-ev", "pytorch ddp")])
        if "emulated" in want:
            slow = cluster_file(tmp, "emulated-2", 2.0)
            # the best hand-set split for DDP, found once (each split timed twice)
            best, best_t = None, None
            for a in range(8, 14):
                split = [a, BATCH - a]
                t = min(run_torch(args, "bert", s, 2, split, [1.0, 2.0]) for _ in range(2))
                print("  pytorch ddp split %d:%d: %.1f ms" % (a, BATCH - a, 1e3 * t), flush=True)
                if best_t is None or t < best_t:
                    best, best_t = split, t
            got = alternate(args.rounds, {
                "hspmd synth": lambda: run_hspmd(args, "bert", s, 2, slow, "synth"),
                "pytorch ddp %d:%d" % tuple(best): lambda: run_torch(args, "bert", s, 2, best,
                                                                     [1.0, 2.0]),
                "hspmd dp-ev": lambda: run_hspmd(args, "bert", s, 2, slow, "dp-ev")})
            ddp = "pytorch ddp %d:%d" % tuple(best)
            report("2 ranks, rank 1 emulated 2x slower, BERT-small", got,
                   [("hspmd synth", ddp), ("hspmd synth", "hspmd dp-ev")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
