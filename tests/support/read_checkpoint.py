#!/usr/bin/env python3
"""An independent reader: a checkpoint and its export, read with the standard library and numpy.

  read_checkpoint.py CHECKPOINT_DIR EXPORT_DIR

Assembles every tensor of the checkpoint from its manifest's pieces (boxes in rank files, each
block checked with zlib.crc32), reads the exported safetensors files (one model.safetensors, or
shards with model.safetensors.index.json) with a parser of its own, and checks that both give the
same values. Exits 77 (skipped) without numpy. No hspmd code is used.
"""
import json
import os
import struct
import sys
import zlib

try:
    import numpy as np
except ImportError:
    print("numpy is not installed (Debian: python3-numpy): skipped")
    sys.exit(77)

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def read_file(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + b : 8 + n + e], dtype=DTYPES[t["dtype"]]).reshape(
            t["shape"]
        )
    return out


def checkpoint_tensors(d):
    if os.path.exists(os.path.join(d, "latest")) and not os.path.exists(os.path.join(d, "manifest.json")):
        d = os.path.join(d, open(os.path.join(d, "latest")).read().strip())
    m = json.load(open(os.path.join(d, "manifest.json")))
    dtype = DTYPES[m["dtype"]]
    block = m["block_bytes"]
    out = {}
    for name, t in m["tensors"].items():
        whole = np.full(t["shape"], np.nan, dtype=dtype)
        for p in t["pieces"]:
            with open(os.path.join(d, p["file"]), "rb") as f:
                f.seek(p["data_offset"])
                data = f.read(p["bytes"])
            for k, c in enumerate(p["crc32"]):
                got = "%08x" % zlib.crc32(data[k * block : (k + 1) * block])
                assert got == c, f"{p['file']}: {name}: block {k} crc32 {got} != {c}"
            box = tuple(slice(o, o + n) for o, n in zip(p["offset"], p["length"]))
            whole[box] = np.frombuffer(data, dtype=dtype).reshape(p["length"])
        assert not np.isnan(whole).any(), f"{name}: the pieces do not cover the tensor"
        out[name] = whole
    return out


def exported_tensors(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for f in files:
        out.update(read_file(os.path.join(d, f)))
    return out


def main():
    ckpt, exported = checkpoint_tensors(sys.argv[1]), exported_tensors(sys.argv[2])
    params = {k: v for k, v in ckpt.items() if not k.startswith("optimizer.")}
    assert set(params) == set(exported), f"tensors differ: {set(params) ^ set(exported)}"
    for name, v in params.items():
        assert exported[name].shape == v.shape, f"{name}: shape {exported[name].shape} != {v.shape}"
        assert np.array_equal(exported[name], v), f"{name}: values differ"
    print(f"read with numpy: {len(params)} tensors equal in the checkpoint and its export")


if __name__ == "__main__":
    main()
