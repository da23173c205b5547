#!/usr/bin/env python3
"""A Llama with grouped-query attention written by the reference `transformers` package imports
into hspmd's llama and gives its loss.

    hf_llama_import.py IMPORT_LOSS WORK_DIR

Builds a random LlamaForCausalLM (2 layers, hidden 16, 8 query heads on 2 key/value heads,
SwiGLU 24, vocabulary 40, untied head) with transformers, saves it with save_pretrained
(safetensors and config.json), and computes in float64 the mean next-token loss of seeded
tokens and targets from its logits. IMPORT_LOSS (tests/support/import_loss.cpp) imports the
directory with the llama name table and prints hspmd's loss of the same tokens, through products
and through the fused attention op; both must be within 1e-6 relative of transformers' (its
RMSNorm and rotary tables compute in float32 even in a float64 model, hence not 1e-12).
Exits 77 (skipped) when torch or transformers is missing.
"""
import json
import os
import shutil
import subprocess
import sys

try:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:
    print(f"skipped: {e.name} is not installed for {sys.executable} "
          "(pip install torch transformers to run this test)")
    sys.exit(77)

BATCH, SEQ, VOCAB = 3, 7, 40


def main():
    tool, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    torch.manual_seed(5)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=24,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=64, rms_norm_eps=1e-6,
                         tie_word_embeddings=False, attention_bias=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger weights than the default init: a loss far from log(V)
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    hf = os.path.join(work, "hf")
    model.save_pretrained(hf, safe_serialization=True)

    gen = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    targets = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    model = model.double().eval()
    with torch.no_grad():
        logits = model(input_ids=tokens).logits  # (B, S, V)
        want = torch.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="mean").item()

    data = os.path.join(work, "tokens.json")
    with open(data, "w") as f:
        json.dump({"batch": BATCH, "seq": SEQ, "tokens": tokens.flatten().tolist(),
                   "targets": targets.flatten().tolist()}, f)
    out = subprocess.run([tool, hf, work, data], capture_output=True, text=True)
    print(out.stdout + out.stderr)
    if out.returncode != 0:
        return 1
    got = json.loads(out.stdout)
    print(f"transformers {want:.12f} (float64 model, {BATCH} x {SEQ} tokens, mean)")
    bad = 0
    for key in ("loss", "fused_loss"):
        rel = abs(got[key] - want) / abs(want)
        print(f"hspmd {key} {got[key]:.12f}: relative difference {rel:.2e}")
        bad += rel > 1e-6
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
