#!/usr/bin/env python3
"""The suite's token files (tests/data/tokens/) are what scripts/make_token_data.py writes from
tests/data/text/articles.txt, byte for byte (exit 77, skipped, without numpy)."""
import filecmp
import os
import subprocess
import sys
import tempfile

try:
    import numpy  # noqa: F401
except ImportError:
    print("numpy is not installed: skipped")
    sys.exit(77)
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with tempfile.TemporaryDirectory() as out:
    subprocess.run([sys.executable, os.path.join(root, "scripts", "make_token_data.py"), "--vocab",
                    "32", "--out", out, os.path.join(root, "tests", "data", "text", "articles.txt")],
                   check=True)
    for name in ["articles.bin", "articles-mmap.bin", "articles-mmap.idx", "vocab.json"]:
        committed = os.path.join(root, "tests", "data", "tokens", name)
        if not filecmp.cmp(os.path.join(out, name), committed, shallow=False):
            sys.exit("token_script_check.py: %s differs from what the script writes now" % committed)
print("the committed token files are the script's")
