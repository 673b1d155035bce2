#!/usr/bin/env python3
"""Turns run directories (metrics.jsonl + summary.json) into a Markdown table and an SVG plot of test accuracy
against wall-clock seconds. Standard library only.

    plot_runs.py OUT_DIR RUN_DIR...      # writes OUT_DIR/table.md and OUT_DIR/accuracy.svg
"""
import json
import os
import sys

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def load(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    points = [(0.0, 0.0)]
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            points.append((record["wall_seconds"], record["test_accuracy"]))
    return os.path.basename(os.path.normpath(run_dir)), summary, points


def table(runs):
    lines = ["| run | mode | workers | clocks | model updates | test accuracy | seconds to target | max staleness |",
             "|---|---|---|---|---|---|---|---|"]
    for name, s, _ in runs:
        target = s.get("seconds_to_target")
        lines.append("| {} | {} | {} | {} | {} | {:.4f} | {} | {} |".format(
            name, s["mode"], s["workers"], s["steps"], s["updates_applied"], s["test_accuracy"],
            "{:.1f}".format(target) if target is not None else "not reached", s["max_staleness"]))
    return "\n".join(lines) + "\n"


def svg(runs, width=720, height=420, margin=60):
    max_x = max(p[0] for _, _, pts in runs for p in pts) or 1.0
    min_y, max_y = 0.5, 0.9
    sx = lambda x: margin + (width - 2 * margin) * x / max_x
    sy = lambda y: height - margin - (height - 2 * margin) * (min(max(y, min_y), max_y) - min_y) / (max_y - min_y)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" '
           'font-size="12">'.format(width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="{}" y="24" font-size="15" text-anchor="middle">Test accuracy against wall-clock time</text>'
           .format(width / 2)]
    for i in range(5):  # y grid: 0.5 .. 0.9
        y = min_y + i * (max_y - min_y) / 4
        out.append('<line x1="{0}" x2="{1}" y1="{2:.1f}" y2="{2:.1f}" stroke="#ddd"/>'.format(margin, width - margin, sy(y)))
        out.append('<text x="{}" y="{:.1f}" text-anchor="end">{:.2f}</text>'.format(margin - 6, sy(y) + 4, y))
    for i in range(6):  # x ticks
        x = max_x * i / 5
        out.append('<text x="{:.1f}" y="{}" text-anchor="middle">{:.0f}</text>'.format(sx(x), height - margin + 18, x))
    out.append('<text x="{}" y="{}" text-anchor="middle">wall seconds</text>'.format(width / 2, height - 18))
    out.append('<line x1="{0}" x2="{1}" y1="{2:.1f}" y2="{2:.1f}" stroke="#888" stroke-dasharray="4,4"/>'
               .format(margin, width - margin, sy(0.85)))
    for i, (name, _, pts) in enumerate(runs):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join("{:.1f},{:.1f}".format(sx(x), sy(y)) for x, y in pts)
        out.append('<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>'.format(colour, path))
        ly = height - margin - 18 * (len(runs) - i) - 8  # legend in the lower right, below the curves
        out.append('<line x1="{0}" x2="{1}" y1="{2}" y2="{2}" stroke="{3}" stroke-width="3"/>'
                   .format(width - margin - 150, width - margin - 126, ly, colour))
        out.append('<text x="{}" y="{}">{}</text>'.format(width - margin - 120, ly + 4, name))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out_dir, run_dirs = sys.argv[1], sys.argv[2:]
    runs = [load(d) for d in run_dirs]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(table(runs))
    with open(os.path.join(out_dir, "accuracy.svg"), "w") as f:
        f.write(svg(runs))
    print(table(runs), end="")
    print("plot: " + os.path.join(out_dir, "accuracy.svg"))


if __name__ == "__main__":
    main()
