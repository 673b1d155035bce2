#!/usr/bin/env python3
"""Tabulates and plots the runs of deploy/experiments/heterogeneous.sh.

    heterogeneous_report.py OUT_DIR [TARGET]     # default target 0.85

Reads OUT_DIR/<model>/<mode>/ and OUT_DIR/throttled/ (summary.json, metrics.jsonl, events.jsonl,
cpu_quotas.jsonl); writes OUT_DIR/table.md, OUT_DIR/table.csv, OUT_DIR/<model>.png and OUT_DIR/throttled.png.

The balancer's settling round is the first round from which every worker's share stays within SETTLED of the share
it ends with (a fraction of the global batch); its reversals count the times a worker's share turned (grew after
shrinking, or shrank after growing) from one change to the next, each move larger than SETTLED of the global
batch: 0 for a balancer that never oscillates.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from straggler_report import load, save_table  # noqa: E402

MODES = ["equal", "balanced", "backup", "async", "dcasgd", "ssp2", "ssp8"]
LABELS = {"equal": "SYNC, equal split", "balanced": "SYNC, balanced", "backup": "SYNC, backup workers",
          "async": "ASYNC, staleness-aware rate", "dcasgd": "ASYNC, staleness-aware rate, delay-compensated",
          "ssp2": "SSP(2)", "ssp8": "SSP(8)"}
MODELS = ["mlp", "cnn"]
SETTLED = 0.02  # of the global batch
COLUMNS = ["model", "mode", "seconds_to_target", "steps_to_target", "x_sooner_than_equal", "final_accuracy",
           "examples_per_sec", "shares", "staleness_median", "staleness_p99", "rebalances", "settled_round",
           "reversals", "push_bytes_per_example", "dc_relative_correction", "run_seconds"]


def jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def origin(run):
    """When training started, in the run's wall seconds: once every worker had finished a step (a slow worker
    loads its data slowly too, and start-up is the same in every mode)."""
    with open(os.path.join(run, "summary.json")) as f:
        training = json.load(f).get("training") or {}
    return training.get("every_worker_stepped_wall_seconds", training.get("first_step_wall_seconds", 0.0))


def share_changes(run):
    """(training seconds, round, shares) of every split the balancer adopted, from events.jsonl."""
    start = origin(run)
    return [(e["wall_seconds"] - start, e["round"], e["shares"]) for e in jsonl(os.path.join(run, "events.jsonl"))
            if e.get("event") == "rebalanced"]


def settling(changes, global_batch):
    """(settled round, reversals) of a balanced run's changes; (None, 0) without changes."""
    if not changes:
        return None, 0
    final = changes[-1][2]
    settled = changes[0][1]
    for _, round_, shares in changes:
        if any(abs(s - f) > SETTLED * global_batch for s, f in zip(shares, final)):
            settled = None  # outside: the next change may be the one that settles
        elif settled is None:
            settled = round_
    reversals = 0
    band = SETTLED * global_batch
    for w in range(len(final)):
        steps = [b[2][w] - a[2][w] for a, b in zip(changes, changes[1:]) if abs(b[2][w] - a[2][w]) > band]
        reversals += sum(1 for a, b in zip(steps, steps[1:]) if (a > 0) != (b > 0))
    return settled, reversals


def made_at(record):
    """When the evaluated values were made (the evaluating worker finished that step), in the run's wall seconds;
    when the evaluation's result arrived, for records without it."""
    return record.get("clock_wall_seconds", record["wall_seconds"])


def reached(records, start, target):
    """(training seconds from `start`, step) of the first values that scored at or above `target`."""
    for r in records:
        if r["test_accuracy"] >= target:
            return made_at(r) - start, r["step"]
    return None, None


def row(model, mode, run, target, equal_seconds):
    summary, records = load(run)
    balance = summary.get("balance", {})
    examples = balance.get("examples") or []
    seconds = (summary.get("training") or {}).get("seconds") or summary["wall_seconds"]
    total = sum(examples) or 1
    staleness = summary.get("staleness", {}).get("all", {})
    global_batch = sum(balance.get("shares") or [0])
    settled, reversals = settling(share_changes(run), global_batch) if mode == "balanced" else (None, 0)
    t, step = reached(records, origin(run), target)
    return {
        "model": model, "mode": mode,
        "seconds_to_target": round(t, 1) if t is not None else None,
        "steps_to_target": step,
        "x_sooner_than_equal": round(equal_seconds / t, 2) if t and equal_seconds else None,
        "final_accuracy": round(summary["test_accuracy"], 4) if summary.get("test_accuracy") is not None else None,
        "examples_per_sec": [round(e / seconds) for e in examples],
        "shares": [round(e / total, 3) for e in examples],
        "staleness_median": staleness.get("median"), "staleness_p99": staleness.get("p99"),
        "rebalances": balance.get("rebalances") if mode == "balanced" else None,
        "settled_round": settled, "reversals": reversals if mode == "balanced" else None,
        "push_bytes_per_example": round(summary["push_bytes"] / total) if summary.get("push_bytes") else None,
        # Delay compensation: |correction| / |gradient| over the pushes it corrected.
        "dc_relative_correction": (round(summary["delay_compensation"]["relative_correction"], 4)
                                   if (summary.get("delay_compensation") or {}).get("relative_correction") is not None
                                   else None),
        "run_seconds": round(summary["wall_seconds"], 1),
    }


def plot_shares(ax, run, title, marks=()):
    changes = share_changes(run)
    summary, _ = load(run)
    shares = summary.get("balance", {}).get("shares") or []
    workers = len(shares)
    if workers == 0:
        return
    global_batch = sum(shares)
    end = summary["wall_seconds"] - origin(run)
    xs = [0.0] + [c[0] for c in changes] + [end]
    for w in range(workers):
        ys = [1.0 / workers] + [c[2][w] / global_batch for c in changes]
        ax.step(xs, ys + ys[-1:], where="post", label="worker %d" % w)
    for x, label in marks:
        ax.axvline(x, color="grey", linestyle="--")
        ax.text(x, 0.98, label, rotation=90, va="top", ha="right", fontsize=8, transform=ax.get_xaxis_transform())
    ax.set_xlabel("seconds of training (from every worker's first step)")
    ax.set_ylabel("share of each round's batch")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)


def plot_model(out, model, runs, target):
    # The shares' panel only beside a balanced run.
    panels = 2 if "balanced" in runs else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 4.8), squeeze=False)
    axes = axes[0]
    for mode, run in runs.items():
        _, records = load(run)
        start = origin(run)
        axes[0].plot([made_at(r) - start for r in records], [r["test_accuracy"] for r in records],
                     label=LABELS[mode])
    axes[0].axhline(target, color="grey", linestyle=":")
    axes[0].set_xlabel("seconds of training (from every worker's first step)")
    axes[0].set_ylabel("test accuracy")
    axes[0].set_ylim(0.5, 0.92)
    axes[0].grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[0].set_title("time to accuracy", fontsize=10)
    if "balanced" in runs:
        plot_shares(axes[1], runs["balanced"], "SYNC, balanced: each worker's share over time")
    fig.suptitle("%s on unequal workers (CPU quotas %s)" % (model.upper(), quotas_of(next(iter(runs.values())))))
    fig.tight_layout()
    path = os.path.join(out, model + ".png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def quotas_of(run):
    """Each worker's first quota (set after its first step), 'a,b,c' in rank order."""
    first = {}
    for q in jsonl(os.path.join(run, "cpu_quotas.jsonl")):
        first.setdefault(q["worker"], q["cpus"])
    return ",".join("%g" % first[w] for w in sorted(first)) or "none"


def plot_throttled(out, run):
    """Each worker's share over time, with a line where the quotas changed (--worker_cpu_quota_at)."""
    sets = [q for q in jsonl(os.path.join(run, "cpu_quotas.jsonl")) if q.get("reason") != "finished its first step"]
    events = jsonl(os.path.join(run, "events.jsonl"))
    marks = []
    if events and sets:
        # The quota file's clock is unix seconds; the scheduler's events carry both.
        offset = events[0]["unix_seconds"] - events[0]["wall_seconds"] + origin(run)
        for reason in sorted({q["reason"] for q in sets}, key=lambda r: min(q["unix_seconds"] for q in sets
                                                                           if q["reason"] == r)):
            batch = [q for q in sets if q["reason"] == reason]
            marks.append((min(q["unix_seconds"] for q in batch) - offset, "quotas " + ",".join(
                "%g" % q["cpus"] for q in sorted(batch, key=lambda q: q["worker"]))))
    fig, ax = plt.subplots(1, 1, figsize=(8, 4.8))
    plot_shares(ax, run, "SYNC, balanced; quotas %s, then a worker throttled" % quotas_of(run), marks)
    fig.tight_layout()
    path = os.path.join(out, "throttled.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path, marks


def throttled_summary(run, marks):
    """How the shares followed the throttling: the round it came at and the rounds until they settled again."""
    changes = share_changes(run)
    if not marks:
        return None
    at = marks[0][0]
    before = [c for c in changes if c[0] < at]
    after = [c for c in changes if c[0] >= at]
    summary, _ = load(run)
    global_batch = sum(summary.get("balance", {}).get("shares") or [0])
    settled, reversals = settling(after, global_batch)
    first_round = after[0][1] if after else None
    return {"throttled_at_seconds": round(at, 1), "shares_before": before[-1][2] if before else None,
            "first_change_round": first_round, "settled_round": settled, "reversals": reversals,
            "shares_after": after[-1][2] if after else None, "changes_after": len(after)}


def main():
    out = sys.argv[1]
    target = float(sys.argv[2]) if len(sys.argv) > 2 else 0.85
    rows = []
    for model in MODELS:
        runs = {m: os.path.join(out, model, m) for m in MODES
                if os.path.exists(os.path.join(out, model, m, "summary.json"))}
        if not runs:
            continue
        equal = reached(load(runs["equal"])[1], origin(runs["equal"]), target)[0] if "equal" in runs else None
        for mode, run in runs.items():
            rows.append(row(model, mode, run, target, equal))
        print("plot:", plot_model(out, model, runs, target))
    header = ["model", "mode", "training seconds to %.2f" % target, "steps to %.2f" % target, "x sooner than equal",
              "final accuracy", "examples/s per worker", "share per worker", "staleness median", "p99",
              "balancer changes", "settled at round", "reversals", "bytes pushed per example",
              "DC correction / gradient"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        def cell(v):
            return "-" if v is None else ", ".join(str(x) for x in v) if isinstance(v, list) else str(v)
        lines.append("| " + " | ".join(cell(v) for v in [
            r["model"], LABELS[r["mode"]], r["seconds_to_target"] if r["seconds_to_target"] else "not reached",
            r["steps_to_target"], r["x_sooner_than_equal"], r["final_accuracy"], r["examples_per_sec"], r["shares"],
            r["staleness_median"], r["staleness_p99"], r["rebalances"], r["settled_round"], r["reversals"],
            r["push_bytes_per_example"], r["dc_relative_correction"]]) + " |")
    for model in MODELS:
        timed = [r for r in rows if r["model"] == model and r["seconds_to_target"]]
        if not timed:
            continue
        best = min(timed, key=lambda r: r["seconds_to_target"])
        equal = next((r for r in rows if r["model"] == model and r["mode"] == "equal"), None)
        lines.append("")
        lines.append("%s: %s reaches %.2f first, in %.1f s%s." % (
            model, LABELS[best["mode"]], target, best["seconds_to_target"],
            ", %.2fx sooner than the equal split" % (equal["seconds_to_target"] / best["seconds_to_target"])
            if equal and equal["seconds_to_target"] else ""))
    throttled = os.path.join(out, "throttled")
    if os.path.exists(os.path.join(throttled, "summary.json")):
        path, marks = plot_throttled(out, throttled)
        print("plot:", path)
        followed = throttled_summary(throttled, marks)
        if followed:
            lines.append("")
            lines.append("throttled: at %.1f s; shares %s before, first change at round %s, settled at round %s "
                         "(%d changes after, %d reversals), shares %s after." % (
                             followed["throttled_at_seconds"], followed["shares_before"],
                             followed["first_change_round"], followed["settled_round"], followed["changes_after"],
                             followed["reversals"], followed["shares_after"]))
    save_table(out, "table", COLUMNS, rows, lines)


if __name__ == "__main__":
    main()
