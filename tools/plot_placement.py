#!/usr/bin/python3
"""Plots of `dsinfer-bench --place-csv` (docs/placement.md): decode tokens/s and expert-cache
hit rate against the resident fraction of the routed experts, LRU (blue) and LFU (orange),
the all-resident run as a grey line. Writes PNG files (no plotting library needed: a small
PNG writer and a 3x5 digit font are included) and copies the CSV beside them.

usage: tools/plot_placement.py place.csv -o out_prefix
  -> out_prefix-tps.png, out_prefix-hit.png, out_prefix.csv
"""
import argparse
import csv
import shutil
import struct
import zlib

W, H, M = 480, 320, 40  # image size, margin
FONT = {  # 3x5 glyphs, rows top to bottom, 3 bits each
    "0": [7, 5, 5, 5, 7], "1": [2, 6, 2, 2, 7], "2": [7, 1, 7, 4, 7], "3": [7, 1, 7, 1, 7],
    "4": [5, 5, 7, 1, 1], "5": [7, 4, 7, 1, 7], "6": [7, 4, 7, 5, 7], "7": [7, 1, 1, 1, 1],
    "8": [7, 5, 7, 5, 7], "9": [7, 5, 7, 1, 7], ".": [0, 0, 0, 0, 2], "%": [5, 1, 2, 4, 5],
}


class Canvas:
    def __init__(self):
        self.px = bytearray(b"\xff" * (W * H * 3))

    def dot(self, x, y, c, r=0):
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                xx, yy = int(x) + dx, int(y) + dy
                if 0 <= xx < W and 0 <= yy < H:
                    i = (yy * W + xx) * 3
                    self.px[i:i + 3] = bytes(c)

    def line(self, x0, y0, x1, y1, c):
        n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for i in range(n + 1):
            t = i / n
            self.dot(x0 + (x1 - x0) * t, y0 + (y1 - y0) * t, c)

    def text(self, x, y, s, c=(0, 0, 0), scale=2):
        for ch in s:
            g = FONT.get(ch)
            if g:
                for r, bits in enumerate(g):
                    for b in range(3):
                        if bits >> (2 - b) & 1:
                            for sy in range(scale):
                                for sx in range(scale):
                                    self.dot(x + b * scale + sx, y + r * scale + sy, c)
            x += 4 * scale

    def png(self, path):
        raw = b"".join(b"\x00" + bytes(self.px[y * W * 3:(y + 1) * W * 3]) for y in range(H))

        def chunk(t, d):
            return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)) +
                    chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def plot(rows, key, path, pct):
    cv = Canvas()
    ymax = max(float(r[key]) for r in rows) or 1.0
    ymax *= 1.1
    X = lambda f: M + f * (W - 2 * M)  # noqa: E731
    Y = lambda v: H - M - v / ymax * (H - 2 * M)  # noqa: E731
    cv.line(M, H - M, W - M, H - M, (0, 0, 0))
    cv.line(M, M, M, H - M, (0, 0, 0))
    for i in range(5):
        f = i / 4
        cv.line(X(f), H - M, X(f), H - M + 4, (0, 0, 0))
        cv.text(X(f) - 8, H - M + 8, "%d%%" % round(100 * f))
        v = ymax * i / 4
        cv.line(M - 4, Y(v), M, Y(v), (0, 0, 0))
        cv.text(2, Y(v) - 5, ("%d%%" % round(100 * v)) if pct else ("%.0f" % v if v >= 10 else "%.1f" % v), scale=1)
    for r in rows:
        if r["cache_policy"] == "-":
            v = float(r[key])
            cv.line(M, Y(v), W - M, Y(v), (150, 150, 150))
    for pol, col in (("lru", (31, 119, 180)), ("lfu", (255, 127, 14))):
        pts = sorted((float(r["resident_fraction"]), float(r[key])) for r in rows
                     if r["cache_policy"] == pol and "no-read-ahead" not in r["placement"])
        for (a, b), (c, d) in zip(pts, pts[1:]):
            cv.line(X(a), Y(b), X(c), Y(d), col)
        for a, b in pts:
            cv.dot(X(a), Y(b), col, 2)
    cv.png(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("-o", required=True, help="output prefix")
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.csv)))
    if not rows:
        raise SystemExit("no rows in %s" % a.csv)
    plot(rows, "tokens_per_s", a.o + "-tps.png", False)
    plot(rows, "hit_rate", a.o + "-hit.png", True)
    shutil.copyfile(a.csv, a.o + ".csv")
    print("wrote %s-tps.png, %s-hit.png, %s.csv" % (a.o, a.o, a.o))


if __name__ == "__main__":
    main()
