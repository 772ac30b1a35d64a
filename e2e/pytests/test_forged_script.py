"""The forged worker's script (e2e/src/forged.rs, `SCRIPT`) is valid Python: the copied-worker
scenario and the chaos run's ForgedWorker fault run it in the trainer image, where a syntax
error would only show as a pod that posts nothing."""

from __future__ import annotations

import re
from pathlib import Path

FORGED = Path(__file__).resolve().parents[1] / "src" / "forged.rs"


def test_the_forged_workers_script_compiles_and_reads_its_claims_from_the_environment() -> None:
    script = re.search(r'const SCRIPT: &str = r#"(.*?)"#;', FORGED.read_text(), re.S)
    assert script, "SCRIPT not found in e2e/src/forged.rs"
    compile(script.group(1), "forged-worker", "exec")
    for name in ("FORGED_RANK", "FORGED_ATTEMPT", "FORGED_STEP", "FORGED_FILE", "TRAINYARD_PROGRESS_TOKEN_FILE"):
        assert f'os.environ["{name}"]' in script.group(1), name
