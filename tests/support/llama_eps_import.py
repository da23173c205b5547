#!/usr/bin/env python3
"""Imports that refuse what they cannot honour (docs/checkpoint.md, "Importing").

    llama_eps_import.py HSPMD_CHECKPOINT LLAMA_EXAMPLE WORK_DIR

Writes a tiny Llama in Hugging Face's names (safetensors written field by field with numpy;
config.json with rms_norm_eps 1e-05, Llama-2's) and checks, each by its output:
- `import --names gpt2` of it is refused in one line that names the likely table (llama);
- `import --names llama` records config.json's epsilon;
- the llama example started from it (--init-from) runs at that epsilon, not its default 1e-06;
- `--norm-eps 1e-06` with it is refused in one line.
Exits 77 (skipped) without numpy.
"""
import json
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
except ImportError:
    print("skipped: numpy is not installed for %s" % sys.executable)
    sys.exit(77)

H, FFN, VOCAB, LAYERS = 8, 12, 16, 2


def save(path, tensors):
    header, blobs, at = {}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def run(cmd, ok):
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = r.stdout + r.stderr
    print("$ %s\n%s" % (" ".join(cmd), out))
    if (r.returncode == 0) != ok:
        sys.exit("llama_eps_import.py: exit status %d, expected %s" % (r.returncode,
                                                                    "0" if ok else "non-zero"))
    return out


def expect(out, text):
    if text not in out:
        sys.exit("llama_eps_import.py: expected %r in the output above" % text)


def main():
    tool, llama, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    hf = os.path.join(work, "hf")
    os.makedirs(hf)
    rng = np.random.default_rng(5)
    t = {"model.embed_tokens.weight": rng.normal(0, 0.1, (VOCAB, H)),
         "model.norm.weight": np.ones(H), "lm_head.weight": rng.normal(0, 0.1, (VOCAB, H))}
    for i in range(LAYERS):
        p = "model.layers.%d." % i
        t[p + "input_layernorm.weight"] = np.ones(H)
        t[p + "post_attention_layernorm.weight"] = np.ones(H)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[p + "self_attn.%s.weight" % proj] = rng.normal(0, 0.1, (H, H))
        t[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.1, (FFN, H))
        t[p + "mlp.up_proj.weight"] = rng.normal(0, 0.1, (FFN, H))
        t[p + "mlp.down_proj.weight"] = rng.normal(0, 0.1, (H, FFN))
    save(os.path.join(hf, "model.safetensors"), t)
    json.dump({"num_attention_heads": 2, "rms_norm_eps": 1e-05},
              open(os.path.join(hf, "config.json"), "w"))
    ck = os.path.join(work, "ckpt")
    out = run([tool, "import", hf, "--names", "gpt2", "--out", ck], False)
    expect(out, "matches the gpt2 name table poorly: 1 of 21 source tensors named")
    expect(out, "give --names llama")
    out = run([tool, "import", hf, "--names", "llama", "--out", ck], True)
    expect(out, "normalization epsilon 1e-05 (config.json's rms_norm_eps)")
    model = [llama, "--layers", str(LAYERS), "--hidden", str(H), "--ffn", str(FFN), "--heads", "2",
             "--vocab", str(VOCAB), "--seq", "4", "--batch", "2", "--steps", "2", "--init-from", ck]
    out = run(model, True)
    expect(out, "normalization epsilon 1e-05 from")
    expect(out, "the model's default is 1e-06")
    out = run(model + ["--norm-eps", "1e-6"], False)
    expect(out, "--norm-eps 1e-06: differs from the epsilon")
    expect(out, "drop --norm-eps, or give 1e-05")
    print("the import refuses the wrong table and carries config.json's epsilon into the run")


if __name__ == "__main__":
    main()
