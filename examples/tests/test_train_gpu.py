"""examples/train_gpu.py: the settings each process runs with (no torch needed), and one short
run on the CPU through its gloo path (needs torch; skipped where it is missing)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EXAMPLES))

import train_gpu  # noqa: E402

Settings, Invalid = train_gpu.Settings, train_gpu.Invalid


def test_with_gpus_each_process_drives_the_gpu_of_its_local_rank_over_nccl():
    s = Settings.from_env({"LOCAL_RANK": "3"}, cuda_available=True, device_count=8)
    assert (s.backend, s.device, s.local_rank) == ("nccl", "cuda:3", 3)


def test_the_collective_timeout_defaults_to_pytorchs_ten_minutes_and_can_be_set():
    assert Settings.from_env({}, True, 1).timeout_seconds == 600 == train_gpu.NCCL_DEFAULT_TIMEOUT_SECONDS
    assert Settings.from_env({"NCCL_TIMEOUT_SECONDS": "90"}, True, 1).timeout_seconds == 90
    for bad, says in [("ten", "not an integer"), ("0", "at least 1")]:
        with pytest.raises(Invalid, match=says):
            Settings.from_env({"NCCL_TIMEOUT_SECONDS": bad}, True, 1)


def test_without_cuda_it_runs_on_the_cpu_over_gloo():
    s = Settings.from_env({"LOCAL_RANK": "1"}, cuda_available=False, device_count=0)
    assert (s.backend, s.device) == ("gloo", "cpu")
    assert "gloo on cpu" in s.describe()


def test_more_processes_than_gpus_is_refused_naming_the_setting():
    with pytest.raises(Invalid, match="LOCAL_RANK=2, but the container sees 2 GPU"):
        Settings.from_env({"LOCAL_RANK": "2"}, cuda_available=True, device_count=2)


def test_nccl_asked_for_without_a_gpu_is_refused():
    with pytest.raises(Invalid, match="CUDA is not available"):
        Settings.from_env({"TORCH_BACKEND": "nccl"}, cuda_available=False, device_count=0)
    with pytest.raises(Invalid, match="nccl or gloo"):
        Settings.from_env({"TORCH_BACKEND": "mpi"}, cuda_available=True, device_count=1)


def test_the_model_size_is_read_from_the_environment():
    s = Settings.from_env({"MODEL_WIDTH": "64", "BATCH_SIZE": "8"}, False, 0)
    assert (s.width, s.batch) == (64, 8)


def run(tmp_path, **env):
    environ = dict(os.environ, CHECKPOINT_PATH=str(tmp_path / "latest.pt"), TOTAL_STEPS="6",
                   CHECKPOINT_EVERY="3", MODEL_WIDTH="16", BATCH_SIZE="4", **env)
    return subprocess.run([sys.executable, str(EXAMPLES / "train_gpu.py")], env=environ,
                          capture_output=True, text=True, timeout=120)


def test_a_cpu_run_checkpoints_and_a_second_attempt_resumes(tmp_path):
    pytest.importorskip("torch")
    first = run(tmp_path, TOTAL_STEPS="3")
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "latest.pt").is_file()
    second = run(tmp_path, RESUME_FROM=str(tmp_path / "latest.pt"), TRAINYARD_ATTEMPT="1")
    assert second.returncode == 0, second.stderr
    assert "resuming from step 3" in second.stdout + second.stderr
