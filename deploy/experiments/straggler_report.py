#!/usr/bin/env python3
"""Tabulates and plots the runs of deploy/experiments/stragglers.sh.

    straggler_report.py OUT_DIR [TARGET] [AT_SECONDS]     # defaults: 0.85, 20

Reads OUT_DIR/<scenario>/<mode>/{metrics.jsonl,summary.json}; writes OUT_DIR/results.csv, OUT_DIR/results.md and
OUT_DIR/<scenario>.png.
"""
import csv
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = ["sync", "balance", "backup", "async", "async_salr", "ssp1", "ssp3"]
LABELS = {"sync": "sync", "balance": "sync + balance", "backup": "sync + 1 backup", "async": "async",
          "async_salr": "async, staleness-aware step", "ssp1": "SSP(1)", "ssp3": "SSP(3)"}
COLUMNS = ["scenario", "mode", "seconds_to_target", "accuracy_at_seconds", "model_updates_per_sec",
           "staleness_median", "staleness_p99", "staleness_max", "late_gradients", "final_accuracy", "wall_seconds"]


def load(run):
    with open(os.path.join(run, "summary.json")) as f:
        summary = json.load(f)
    records = []
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            records.append(json.loads(line))
    return summary, records


def save_table(out, name, columns, rows, lines):
    """Writes OUT/<name>.csv (the rows) and OUT/<name>.md (the lines of text), and prints the text."""
    with open(os.path.join(out, name + ".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, name + ".md"), "w") as f:
        f.write(text)
    print(text)


def row(scenario, mode, summary, records, target, at_seconds):
    reached = [r["wall_seconds"] for r in records if r["test_accuracy"] >= target]
    before = [r["test_accuracy"] for r in records if r["wall_seconds"] <= at_seconds]
    staleness = summary.get("staleness", {}).get("all", {})
    return {
        "scenario": scenario, "mode": mode,
        "seconds_to_target": round(reached[0], 1) if reached else None,
        "accuracy_at_seconds": round(before[-1], 4) if before else None,
        "model_updates_per_sec": round(summary["updates_applied"] / summary["wall_seconds"], 1),
        "staleness_median": staleness.get("median"), "staleness_p99": staleness.get("p99"),
        "staleness_max": staleness.get("max"),
        "late_gradients": sum(summary.get("rounds", {}).get("late_rounds", [])),
        "final_accuracy": round(summary["test_accuracy"], 4) if summary.get("test_accuracy") is not None else None,
        "wall_seconds": round(summary["wall_seconds"], 1),
    }


def plot(out, scenario, runs):
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for mode, (summary, records) in runs.items():
        xs = [0.0] + [r["wall_seconds"] for r in records]
        ups = [0] + [r["updates_applied"] for r in records]
        ys = [0.0] + [r["test_accuracy"] for r in records]
        axes[0].plot(xs, ys, label=LABELS[mode])
        axes[1].plot(ups, ys, label=LABELS[mode])
        buckets = summary.get("staleness", {}).get("all", {}).get("buckets", [])
        total = sum(buckets) or 1
        axes[2].step(range(len(buckets)), [b / total for b in buckets], where="mid", label=LABELS[mode])
    axes[0].set_xlabel("wall seconds")
    axes[1].set_xlabel("model updates")
    for ax in axes[:2]:
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0.6, 0.9)
        ax.grid(alpha=0.3)
    axes[2].set_xlabel("staleness of an update (clocks; the last bucket holds 64 and more)")
    axes[2].set_ylabel("fraction of pushes")
    axes[2].set_yscale("log")
    axes[2].grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Stragglers: " + scenario)
    fig.tight_layout()
    path = os.path.join(out, scenario + ".png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main():
    out = sys.argv[1]
    target = float(sys.argv[2]) if len(sys.argv) > 2 else 0.85
    at_seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 20.0
    rows = []
    for scenario in sorted(os.listdir(out)):
        if not os.path.isdir(os.path.join(out, scenario)):
            continue
        runs = {}
        for mode in MODES:
            run = os.path.join(out, scenario, mode)
            if os.path.exists(os.path.join(run, "summary.json")):
                runs[mode] = load(run)
                rows.append(row(scenario, mode, *runs[mode], target, at_seconds))
        if runs:
            print("plot:", plot(out, scenario, runs))
    header = ["scenario", "mode", "seconds to %.2f" % target, "accuracy at %g s" % at_seconds, "model updates/s",
              "staleness median", "p99", "max", "late gradients"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        def quantile(q):  # the histogram's last bucket holds 64 and more
            return ">= 64" if q is not None and q >= 64 else q
        cells = [r["scenario"], LABELS[r["mode"]], r["seconds_to_target"] or "not reached", r["accuracy_at_seconds"],
                 r["model_updates_per_sec"], quantile(r["staleness_median"]), quantile(r["staleness_p99"]),
                 r["staleness_max"], r["late_gradients"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    save_table(out, "results", COLUMNS, rows, lines)


if __name__ == "__main__":
    main()
