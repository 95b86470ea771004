#!/usr/bin/python3
"""Reference implementations of xsilo's robust rules in numpy, timed on the same matrix.

Run by `xsilo bench robust` (Debian's /usr/bin/python3 with python3-numpy). The definitions
are those of docs/robust.md, written the way the papers state them: distances by subtracting
rows, medians and trimmed means by sorting each coordinate. Prints one JSON object per rule:
{"rule": ..., "seconds": ..., "aggregate": path of the .npy it wrote}.
"""
import json
import sys
import time

import numpy as np


def krum_scores(x, f):
    n = x.shape[0]
    k = n - f - 2
    scores = np.empty(n)
    for i in range(n):
        d = np.sum((x - x[i]) ** 2, axis=1, dtype=np.float64)
        d = np.delete(d, i)
        scores[i] = np.sum(np.sort(d)[:k])
    return scores


def krum(x, f):
    return x[np.argmin(krum_scores(x, f))].copy()


def multi_krum(x, f, m):
    best = np.argsort(krum_scores(x, f), kind="stable")[:m]
    return x[np.sort(best)].mean(axis=0, dtype=np.float64).astype(np.float32)


def median(x):
    return np.median(x, axis=0).astype(np.float32)


def trimmed_mean(x, b):
    s = np.sort(x, axis=0)
    return s[b:x.shape[0] - b].mean(axis=0, dtype=np.float64).astype(np.float32)


def main():
    path, f = sys.argv[1], int(sys.argv[2])
    x = np.load(path, mmap_mode=None)
    n = x.shape[0]
    rules = {
        "median": lambda: median(x),
        "trimmed_mean": lambda: trimmed_mean(x, f),
        "krum": lambda: krum(x, f),
        "multi_krum": lambda: multi_krum(x, f, n - f),
    }
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else list(rules)
    for name in only:
        t0 = time.perf_counter()
        agg = rules[name]()
        secs = time.perf_counter() - t0
        out = f"{path}.{name}.npy"
        np.save(out, agg)
        print(json.dumps({"rule": name, "seconds": secs, "aggregate": out}), flush=True)


if __name__ == "__main__":
    main()
