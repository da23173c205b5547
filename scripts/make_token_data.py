#!/usr/bin/env python3
"""Pre-tokenize a text corpus (wikitext-2's train/valid/test text) into the token files the
language-model examples read (docs/data.md), with numpy alone -- nothing of hspmd's:

  OUT/NAME.bin            flat uint16 token ids, nanoGPT's train.bin layout
  OUT/NAME-mmap.bin/.idx  a Megatron-LM indexed dataset: one sequence per non-empty line, one
                          document per article (a line " = Title = " starts one); uint16 ids
  OUT/vocab.json          the vocabulary: id -> word (id 0 "<unk>")

Words are split on whitespace; the vocabulary is "<unk>" and the --vocab - 1 most frequent words
of the first file (ties alphabetical), so every file given shares it.

    python3 scripts/make_token_data.py --vocab 8192 --out /tmp/wt2 \
        ../shared/data/wikitext-2/valid.txt ../shared/data/wikitext-2/test.txt

writes /tmp/wt2/valid.bin, valid-mmap.{bin,idx}, test.bin, test-mmap.{bin,idx}.
"""
import argparse
import collections
import json
import os
import re
import struct
import sys

import numpy as np

HEADING = re.compile(r"^ = [^=].* = $")  # an article's title line; " = = Section = = " is not


def articles(path):
    """The file's articles, each a list of its non-empty lines' words."""
    docs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            words = line.split()
            if HEADING.match(line) or not docs:
                docs.append([])
            if words:
                docs[-1].append(words)
    return [d for d in docs if d]


def vocabulary(docs, size):
    counts = collections.Counter(w for d in docs for line in d for w in line)
    counts.pop("<unk>", None)  # the corpus's own unknown-word mark is id 0
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ["<unk>"] + [w for w, _ in ranked[: size - 1]]


def write_flat(path, docs, ids):
    toks = np.fromiter((ids.get(w, 0) for d in docs for line in d for w in line), dtype=np.uint16)
    toks.tofile(path)
    return len(toks)


def write_indexed(prefix, docs, ids):
    """Megatron-LM's MMIDIDX layout, version 1, written field by field."""
    sizes, doc_idx = [], [0]
    with open(prefix + ".bin", "wb") as b:
        for d in docs:
            for line in d:
                arr = np.array([ids.get(w, 0) for w in line], dtype=np.uint16)
                b.write(arr.tobytes())
                sizes.append(len(arr))
            doc_idx.append(len(sizes))
    sizes = np.array(sizes, dtype=np.int32)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64) * 2)  # bytes: uint16 ids
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))          # version
        f.write(struct.pack("<B", 8))          # the ids' type: 8 = uint16
        f.write(struct.pack("<Q", len(sizes)))  # sequences
        f.write(struct.pack("<Q", len(doc_idx)))  # document index entries
        f.write(sizes.astype("<i4").tobytes())
        f.write(pointers.astype("<i8").tobytes())
        f.write(np.array(doc_idx, dtype="<i8").tobytes())
    return int(sizes.sum()), len(docs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="text files; the first sets the vocabulary")
    ap.add_argument("--vocab", type=int, default=8192, help="vocabulary size (<= 65536)")
    ap.add_argument("--out", required=True, help="output folder")
    a = ap.parse_args()
    if not 2 <= a.vocab <= 65536:
        sys.exit("make_token_data.py: --vocab %d: give 2..65536 (uint16 ids)" % a.vocab)
    os.makedirs(a.out, exist_ok=True)
    corpora = [(f, articles(f)) for f in a.files]
    words = vocabulary(corpora[0][1], a.vocab)
    ids = {w: i for i, w in enumerate(words)}
    with open(os.path.join(a.out, "vocab.json"), "w") as f:
        json.dump(words, f)
    for path, docs in corpora:
        name = os.path.splitext(os.path.basename(path))[0]
        n = write_flat(os.path.join(a.out, name + ".bin"), docs, ids)
        m, k = write_indexed(os.path.join(a.out, name + "-mmap"), docs, ids)
        assert m == n
        print("%s: %d tokens, %d articles -> %s.bin, %s-mmap.bin/.idx" %
              (path, n, k, os.path.join(a.out, name), os.path.join(a.out, name)))


if __name__ == "__main__":
    main()
