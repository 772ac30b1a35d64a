#!/usr/bin/env python3
"""Writes the results of chaos runs into docs/reliability.md.

Reads target/chaos/results.jsonl (one line per run, written by e2e/tests/chaos.rs) and
replaces what lies between the markers `<!-- chaos-results -->` and `<!-- /chaos-results -->`
with a table of those runs and a summary, so the table says what the runs did.
Usage: chaos_report.py RESULTS.jsonl DOC.md
"""
import collections
import json
import sys

BEGIN, END = "<!-- chaos-results -->", "<!-- /chaos-results -->"


def passed(run):
    """A run passed when it finished (no harness error) and broke no invariant."""
    return "error" not in run and not run["violations"]


def cell(text):
    """Text as one table cell: its lines joined, its pipes escaped."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip()).replace("|", "\\|")


def row(r):
    if "error" in r:
        # The harness could not finish the run: its faults are the ones scheduled.
        return f"| {r['seed']} | {len(r['faults'])} | | | | | | | | | | | FAIL (unfinished): {cell(r['error'])} |"
    result = "pass" if passed(r) else "FAIL: " + cell("; ".join(r["violations"]))
    return (
        f"| {r['seed']} | {len(r['faults'])} | {r['attempt']} | {r['preemptions']} | "
        f"{r['failures']} | {r['hangs']} | {r.get('in_place', '')} | {standbys(r)} | "
        f"{r['steps_lost']} | "
        f"{r.get('checkpoints_read', '')} | "
        f"{r.get('proc_scans', '')} | {r['wall_seconds']} | {result} |"
    )


def standbys(r):
    """Termination notices met with make before break: replacements that waited for the switch,
    those given up for want of room, and those deleted as their notice was withdrawn first
    (results written before the count leave it empty)."""
    if "standbys_ready" not in r:
        return ""
    return (f"{r['standbys_ready']} ready, {r['standbys_given_up']} given up, "
            f"{r.get('standbys_withdrawn', 0)} withdrawn")


def skips(finished):
    """The faults skipped for want of something to act on; results written before the harness
    recorded skips (127fe23) count them among the faults, so their sum would be unknown."""
    if any("skipped" not in r for r in finished):
        return "skips not recorded: the results predate the count, so their faults include any"
    return f"{sum(r['skipped'] for r in finished)} skipped: nothing to act on"


def render(runs):
    finished = [r for r in runs if "error" not in r]
    kinds = collections.Counter(k for r in finished for k in r["faults"])
    ok = sum(1 for r in runs if passed(r))
    lines = [
        f"{len(runs)} runs, {ok} passed, {len(runs) - ok} failed; "
        f"{sum(len(r['faults']) for r in finished)} faults injected in the finished runs "
        f"({sum(r['not_injected'] for r in finished)} not injected: the job had ended; "
        f"{skips(finished)}).",
        "",
        "| seed | faults | attempt | preemptions | failures | hangs | restarts in place "
        "| standbys | steps lost | latest.pt reads | /proc scans | wall (s) | result |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    lines += [row(r) for r in runs]
    lines += ["", "Faults injected, by kind:", "", "| kind | injected |", "|---|---:|"]
    lines += [f"| {k} | {n} |" for k, n in sorted(kinds.items())]
    return "\n".join(lines)


def main(results_path, doc_path):
    try:
        with open(results_path) as f:
            runs = [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        sys.exit(f"chaos_report: cannot read {results_path}: {e}")
    except json.JSONDecodeError as e:
        sys.exit(f"chaos_report: {results_path} is not JSON lines: {e}")
    with open(doc_path) as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        sys.exit(f"chaos_report: {doc_path} lacks the markers {BEGIN} and {END}")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(doc_path, "w") as f:
        f.write(head + BEGIN + "\n" + render(runs) + "\n" + END + tail)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
