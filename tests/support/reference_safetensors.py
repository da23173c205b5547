#!/usr/bin/env python3
"""A file written by the reference `safetensors` package imports correctly.

    reference_safetensors.py HSPMD_CHECKPOINT WORK_DIR [BERT_EXAMPLE]

Writes a tiny GPT-2 (Hugging Face's names, the "transformer." prefix, the output embedding tied,
float16 and float32 tensors) with safetensors.numpy.save_file, imports it with
`hspmd-checkpoint import --names gpt2 --seq 5`, exports the result and reads the export with
safetensors.numpy.load_file: every hspmd parameter must equal what the documented name table
says (fused attention split in three, the position table cut to 5 rows, the head the transposed
embedding, a zero head bias). With BERT_EXAMPLE, a run of the example starts from the import.
Exits 77 (skipped) when numpy or safetensors is missing.
"""
import os
import re
import shutil
import subprocess
import sys

try:
    import numpy as np
    from safetensors.numpy import load_file, save_file
except ImportError as e:
    print(f"skipped: {e.name} is not installed for {sys.executable} "
          "(pip install safetensors numpy to run this test)")
    sys.exit(77)

H, FFN, VOCAB, POSITIONS, LAYERS = 8, 12, 16, 9, 2


def main():
    tool, work = sys.argv[1], sys.argv[2]
    bert = sys.argv[3] if len(sys.argv) > 3 else None
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rng = np.random.default_rng(3)

    def t(*shape, dtype=np.float32):
        return rng.standard_normal(shape).astype(dtype)

    src = {"transformer.wte.weight": t(VOCAB, H, dtype=np.float16),
           "transformer.wpe.weight": t(POSITIONS, H),
           "transformer.ln_f.weight": t(H), "transformer.ln_f.bias": t(H)}
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        for n in ("ln_1", "ln_2"):
            src[p + n + ".weight"] = t(H)
            src[p + n + ".bias"] = t(H)
        src[p + "attn.c_attn.weight"] = t(H, 3 * H, dtype=np.float16)
        src[p + "attn.c_attn.bias"] = t(3 * H)
        src[p + "attn.c_proj.weight"] = t(H, H)
        src[p + "attn.c_proj.bias"] = t(H)
        src[p + "attn.bias"] = np.tril(np.ones((1, 1, POSITIONS, POSITIONS), np.float32))
        src[p + "mlp.c_fc.weight"] = t(H, FFN)
        src[p + "mlp.c_fc.bias"] = t(FFN)
        src[p + "mlp.c_proj.weight"] = t(FFN, H)
        src[p + "mlp.c_proj.bias"] = t(H)
    hf = os.path.join(work, "gpt2")
    os.makedirs(hf)
    save_file(src, os.path.join(hf, "model.safetensors"), metadata={"format": "pt"})

    ckpt = os.path.join(work, "ckpt")
    out = subprocess.run([tool, "import", hf, "--names", "gpt2", "--out", ckpt, "--seq", "5"],
                         capture_output=True, text=True)
    print(out.stdout + out.stderr)
    if out.returncode != 0:
        return 1
    export = os.path.join(work, "export")
    subprocess.run([tool, "export", ckpt, "--out", export], check=True)
    got = load_file(os.path.join(export, "model.safetensors"))

    f = {k: v.astype(np.float32) for k, v in src.items()}
    want = {"tok.table": f["transformer.wte.weight"],
            "pos.table": f["transformer.wpe.weight"][:5],
            "ln_f.gamma": f["transformer.ln_f.weight"], "ln_f.beta": f["transformer.ln_f.bias"],
            "head.weight": f["transformer.wte.weight"].T,
            "head.bias": np.zeros(VOCAB, np.float32)}
    for i in range(LAYERS):
        p, q = f"transformer.h.{i}.", f"layers.{i}."
        for a, b in (("ln_1", "ln1"), ("ln_2", "ln2")):
            want[q + b + ".gamma"] = f[p + a + ".weight"]
            want[q + b + ".beta"] = f[p + a + ".bias"]
        for k, n in enumerate(("wq", "wk", "wv")):
            want[q + f"attn.{n}.weight"] = f[p + "attn.c_attn.weight"][:, k * H:(k + 1) * H]
            want[q + f"attn.{n}.bias"] = f[p + "attn.c_attn.bias"][k * H:(k + 1) * H]
        want[q + "attn.wo.weight"] = f[p + "attn.c_proj.weight"]
        want[q + "attn.wo.bias"] = f[p + "attn.c_proj.bias"]
        want[q + "fc1.weight"] = f[p + "mlp.c_fc.weight"]
        want[q + "fc1.bias"] = f[p + "mlp.c_fc.bias"]
        want[q + "fc2.weight"] = f[p + "mlp.c_proj.weight"]
        want[q + "fc2.bias"] = f[p + "mlp.c_proj.bias"]
    bad = sorted(set(want) ^ set(got))
    if bad:
        print(f"FAIL: names differ: {bad}")
        return 1
    for name, w in want.items():
        if got[name].shape != w.shape or not np.array_equal(got[name], w):
            print(f"FAIL: {name}: got shape {got[name].shape}, want {w.shape}, "
                  f"max difference {np.abs(got[name].astype(np.float64) - w).max()}")
            return 1
    print(f"ok: {len(want)} parameters equal the name table's transforms of the reference file")

    if bert:
        run = subprocess.run([bert, "--layers", str(LAYERS), "--hidden", str(H), "--ffn", str(FFN),
                              "--heads", "2", "--seq", "5", "--vocab", str(VOCAB), "--batch", "2",
                              "--steps", "2", "--init-from", ckpt],
                             capture_output=True, text=True)
        print(run.stdout[-2000:] + run.stderr[-2000:])
        if run.returncode != 0 or not re.search(r"parameters from \S+step-00000000 \(step 0, imported",
                                                run.stdout):
            print("FAIL: the example did not start from the import")
            return 1
        print("ok: the bert example started from the imported parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
