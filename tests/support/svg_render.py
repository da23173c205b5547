#!/usr/bin/env python3
"""SVG files render with a real renderer (Debian's rsvg-convert, librsvg2-bin).

    svg_render.py FILE.svg [FILE.svg ...] [--contains TEXT ...]

Renders each file to PNG beside it and checks the renderer accepts it and the PNG is non-empty
and of sane size; with --contains, that every file holds each TEXT. Exits 77 (skipped) without
rsvg-convert. plan_svg_render.py uses `render`.
"""
import shutil
import struct
import subprocess
import sys


def renderer():
    """rsvg-convert's path; exits 77 (skipped) without it."""
    tool = shutil.which("rsvg-convert")
    if not tool:
        print("skipped: rsvg-convert is not installed (apt-get install librsvg2-bin)")
        sys.exit(77)
    return tool


def render(svg, tool):
    """Renders `svg` to a PNG beside it; exits naming the file unless it is a sane picture."""
    png = svg[:-4] + ".png"
    r = subprocess.run([tool, "-o", png, svg], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("rsvg-convert refused %s: %s" % (svg, r.stderr))
    data = open(png, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit("%s is not a PNG" % png)
    w, h = struct.unpack(">II", data[16:24])
    print("%s: %d x %d px, %d bytes" % (png, w, h, len(data)))
    if not (400 <= w <= 3000 and 150 <= h <= 4000) or len(data) < 2000:
        sys.exit("%s: %d x %d px, %d bytes: not a sane picture" % (png, w, h, len(data)))


def main():
    tool = renderer()
    args = sys.argv[1:]
    texts = []
    if "--contains" in args:
        k = args.index("--contains")
        args, texts = args[:k], args[k + 1:]
    for svg in args:
        render(svg, tool)
        text = open(svg).read()
        for t in texts:
            if t not in text:
                sys.exit("svg_render.py: %r not in %s" % (t, svg))
    print("%d picture(s) render" % len(args))


if __name__ == "__main__":
    main()
