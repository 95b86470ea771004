#!/usr/bin/env python3
"""Accuracy against epsilon, one SVG per panel, from docs/privacy-eval.json.

Usage: python3 scripts/plot_privacy.py docs/privacy-eval.json docs/

The JSON holds the measured means and standard deviations of docs/benchmarks.md's privacy
tables (each panel names the section and the command that produced it); this script only draws
them, with nothing but the standard library, so that the plots are rebuilt from the numbers
and never edited by hand. Each panel becomes OUT_DIR/privacy-<name>.svg: epsilon on a log
axis (1, 3, 8), one line per series with +-1 standard deviation bars, and a series measured
without DP drawn as a dashed level.
"""
import json
import math
import sys

WIDTH, HEIGHT = 560, 360
LEFT, RIGHT, TOP, BOTTOM = 60, 170, 40, 50
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]


def esc(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def panel_svg(panel):
    series = panel["series"]
    epsilons = sorted({p["epsilon"] for s in series for p in s.get("points", [])})
    if not epsilons:
        raise SystemExit(f"panel {panel['name']}: no points")
    lo_e, hi_e = math.log(min(epsilons)), math.log(max(epsilons))
    if hi_e == lo_e:
        hi_e = lo_e + 1
    values = []
    for s in series:
        for p in s.get("points", []):
            values += [p["mean"] - p.get("std", 0), p["mean"] + p.get("std", 0)]
        if "level" in s:
            values.append(s["level"])
    lo_y = max(0.0, math.floor(min(values) / 10) * 10)
    hi_y = min(100.0, math.ceil(max(values) / 10) * 10)
    if hi_y <= lo_y:
        hi_y = lo_y + 10
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(eps):
        return LEFT + 20 + (math.log(eps) - lo_e) / (hi_e - lo_e) * (plot_w - 40)

    def y_of(acc):
        return TOP + (hi_y - acc) / (hi_y - lo_y) * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="14" font-weight="bold">{esc(panel["title"])}</text>',
           f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>']
    step = 10 if hi_y - lo_y > 30 else 5
    acc = lo_y
    while acc <= hi_y + 1e-9:
        y = y_of(acc)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{acc:g}</text>')
        acc += step
    for eps in epsilons:
        x = x_of(eps)
        out.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{eps:g}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 10}" text-anchor="middle">'
               f'epsilon (delta {panel.get("delta", 1e-5):g}, log scale)</text>')
    out.append(f'<text x="16" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 16 {TOP + plot_h / 2:.1f})">test accuracy, %</text>')
    for i, s in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        if "level" in s:
            y = y_of(s["level"])
            out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" '
                       f'stroke="{colour}" stroke-dasharray="6 4"/>')
        points = sorted(s.get("points", []), key=lambda p: p["epsilon"])
        if points:
            path = " ".join(f'{x_of(p["epsilon"]):.1f},{y_of(p["mean"]):.1f}' for p in points)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for p in points:
            x, std = x_of(p["epsilon"]), p.get("std", 0)
            out.append(f'<line x1="{x:.1f}" y1="{y_of(p["mean"] - std):.1f}" x2="{x:.1f}" '
                       f'y2="{y_of(p["mean"] + std):.1f}" stroke="{colour}"/>')
            out.append(f'<circle cx="{x:.1f}" cy="{y_of(p["mean"]):.1f}" r="3" fill="{colour}"/>')
        ly = TOP + 14 + i * 18
        lx = LEFT + plot_w + 10
        dash = ' stroke-dasharray="6 4"' if "level" in s and not points else ""
        out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 18}" y2="{ly - 4}" stroke="{colour}" '
                   f'stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 24}" y="{ly}">{esc(s["label"])}</text>')
    if any("level" in s for s in series):
        ly = TOP + 14 + len(series) * 18 + 8
        out.append(f'<text x="{LEFT + plot_w + 10}" y="{ly}" fill="#555">dashed: the same,</text>')
        out.append(f'<text x="{LEFT + plot_w + 10}" y="{ly + 15}" fill="#555">without DP</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1]) as f:
        panels = json.load(f)["panels"]
    for panel in panels:
        path = f"{sys.argv[2].rstrip('/')}/privacy-{panel['name']}.svg"
        with open(path, "w") as f:
            f.write(panel_svg(panel))
        print(path)


if __name__ == "__main__":
    main()
