"""e2e/chaos_report.py: the results table says what the runs did, failures included."""
import importlib.util
import json
import pathlib

import pytest

SPEC = importlib.util.spec_from_file_location(
    "chaos_report", pathlib.Path(__file__).resolve().parents[1] / "chaos_report.py"
)
chaos_report = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(chaos_report)

PASSED = {
    "seed": 1, "faults": ["LoseNode2", "RestartEtcd"], "not_injected": 0, "attempt": 2,
    "preemptions": 1, "failures": 0, "hangs": 0, "steps_lost": 3, "checkpoints_read": 180,
    "proc_scans": 400, "wall_seconds": 200, "in_place": 1,
    "violations": [],
}
VIOLATED = dict(PASSED, seed=2, violations=["t=12s: two running pods of rank 1"])
UNFINISHED = {"seed": 3, "faults": ["KillOperatorLeader"], "error": "install_chart: timed out"}


def write(tmp_path, runs):
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in runs))
    doc = tmp_path / "reliability.md"
    doc.write_text("# R\n\n<!-- chaos-results -->\nold\n<!-- /chaos-results -->\ntail\n")
    chaos_report.main(str(results), str(doc))
    return doc.read_text()


def test_the_summary_counts_violations_and_unfinished_runs_as_failed(tmp_path):
    doc = write(tmp_path, [PASSED, VIOLATED, UNFINISHED])
    assert "3 runs, 1 passed, 2 failed; 4 faults injected in the finished runs" in doc
    assert "| 2 | 2 | 2 | 1 | 0 | 0 | 1 |  | 3 | 180 | 400 | 200 | FAIL: t=12s: two running pods of rank 1 |" in doc
    assert "| 3 | 1 | | | | | | | | | | | FAIL (unfinished): install_chart: timed out |" in doc
    assert "| LoseNode2 | 2 |" in doc and "KillOperatorLeader" not in doc.split("by kind")[1]


def test_faults_not_injected_and_skipped_are_told_apart_from_those_injected(tmp_path):
    ended = dict(PASSED, seed=4, faults=["RestartEtcd"], not_injected=2, skipped=1)
    doc = write(tmp_path, [dict(PASSED, skipped=0), ended])
    assert (
        "2 runs, 2 passed, 0 failed; 3 faults injected in the finished runs "
        "(2 not injected: the job had ended; 1 skipped: nothing to act on)." in doc
    )
    assert "| 4 | 1 | 2 | 1 | 0 | 0 | 1 |  | 3 | 180 | 400 | 200 | pass |" in doc


def test_results_that_predate_the_in_place_count_leave_its_cell_empty(tmp_path):
    old = {k: v for k, v in PASSED.items() if k != "in_place"}
    doc = write(tmp_path, [old])
    assert "| 1 | 2 | 2 | 1 | 0 | 0 |  |  | 3 | 180 | 400 | 200 | pass |" in doc


def test_notices_met_with_make_before_break_show_both_paths(tmp_path):
    noticed = dict(PASSED, seed=5, standbys_ready=1, standbys_given_up=1, standbys_withdrawn=2)
    doc = write(tmp_path, [noticed])
    assert ("| 5 | 2 | 2 | 1 | 0 | 0 | 1 | 1 ready, 1 given up, 2 withdrawn | 3 | 180 | 400 | "
            "200 | pass |") in doc


def test_results_that_predate_the_skip_count_do_not_claim_none_was_skipped(tmp_path):
    doc = write(tmp_path, [PASSED])
    assert "skips not recorded" in doc and "0 skipped" not in doc


def test_only_the_text_between_the_markers_is_replaced(tmp_path):
    doc = write(tmp_path, [PASSED])
    assert doc.startswith("# R\n\n<!-- chaos-results -->\n1 runs, 1 passed, 0 failed")
    assert "old" not in doc and doc.endswith("<!-- /chaos-results -->\ntail\n")


def test_a_doc_without_markers_is_named(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(PASSED) + "\n")
    doc = tmp_path / "other.md"
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit, match="other.md lacks the markers"):
        chaos_report.main(str(results), str(doc))


def test_an_error_of_several_lines_stays_in_its_row(tmp_path):
    unfinished = dict(UNFINISHED, error="undoing LoseNode2: start failed: a\nb | c\n")
    doc = write(tmp_path, [unfinished])
    assert "| 3 | 1 | | | | | | | | | | | FAIL (unfinished): undoing LoseNode2: start failed: a; b \\| c |" in doc
