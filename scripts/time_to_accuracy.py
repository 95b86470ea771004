#!/usr/bin/env python3
"""Simulated wall-clock to a target accuracy, from `xsilo sim --in-process` runs' rounds.jsonl.

usage: time_to_accuracy.py REFERENCE_OUT OTHER_OUT...
The target is the reference run's final accuracy; for each run: the first sim_ms at which a
committed round reached it, the speed-up against the reference, and the final accuracy.
"""
import json
import sys
from pathlib import Path


def rounds(out):
    with open(Path(out) / "rounds.jsonl") as f:
        return [r for r in map(json.loads, f) if r["status"] == "committed"]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    ref = rounds(sys.argv[1])
    target = ref[-1]["accuracy"]
    ref_ms = next(r["sim_ms"] for r in ref if r["accuracy"] >= target)
    print(f"target accuracy {target:.4f} (final of {sys.argv[1]})")
    print("| run | commits | time to target (s) | speed-up | final accuracy | final sim time (s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for out in sys.argv[1:]:
        rs = rounds(out)
        hit = next((r["sim_ms"] for r in rs if r["accuracy"] >= target), None)
        reach = f"{hit / 1000:.1f}" if hit is not None else "never"
        speed = f"{ref_ms / hit:.1f}x" if hit else "-"
        print(f"| {out} | {len(rs)} | {reach} | {speed} | {rs[-1]['accuracy']:.4f} | {rs[-1]['sim_ms'] / 1000:.1f} |")


if __name__ == "__main__":
    main()
