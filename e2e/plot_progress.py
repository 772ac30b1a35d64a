#!/usr/bin/python3
"""Draws what `make demo` showed: training step over wall time for the preempted job and its
uninterrupted twin, from the progress the operator recorded (status.progress, sampled once a
second by e2e/demo.sh), with the node loss, the operator's restart decision and the next
attempt's first report marked.

usage: plot_progress.py SAMPLES.tsv MARKS.tsv OUT.png

SAMPLES.tsv: `epoch_seconds job attempt step` per line (one line per sample and job).
MARKS.tsv:   `epoch_seconds label` per line (times to mark with a vertical line).
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_samples(path):
    series = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) != 4 or not parts[3].isdigit():
                continue
            t, job, attempt, step = float(parts[0]), parts[1], parts[2], int(parts[3])
            series.setdefault(job, []).append((t, attempt, step))
    return series


def read_marks(path):
    marks = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            t, _, label = line.strip().partition(" ")
            if t:
                marks.append((float(t), label))
    return sorted(marks)


def main(samples_path, marks_path, out):
    series = read_samples(samples_path)
    marks = read_marks(marks_path)
    if not series:
        sys.exit(f"plot_progress: {samples_path} holds no samples")
    t0 = min(t for points in series.values() for t, _, _ in points)
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    for job, points in sorted(series.items()):
        for attempt in sorted({a for _, a, _ in points}):
            xs = [t - t0 for t, a, _ in points if a == attempt]
            ys = [s for _, a, s in points if a == attempt]
            ax.step(xs, ys, where="post", label=f"{job}, attempt {attempt}")
    styles = ["--", "-.", ":"]
    for i, (t, label) in enumerate(marks):
        ax.axvline(t - t0, color="grey", linestyle=styles[i % len(styles)], linewidth=1)
        ax.annotate(label, (t - t0, 0), xytext=(3, 8 + 14 * i), textcoords="offset points",
                    fontsize=8, color="dimgrey")
    ax.set_xlabel("seconds since the first sample")
    ax.set_ylabel("training step (status.progress.step)")
    ax.set_title("A spot node lost mid-training: the job resumes from its checkpoint")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    print(f"plot_progress: wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
