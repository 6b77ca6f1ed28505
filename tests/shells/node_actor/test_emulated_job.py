"""The emulated training process (node_actor.emulated_job): OOM, checkpoint/resume, commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hier_sched.core.failures import REQUEUE_EXIT_CODE, classify_failure
from hier_sched.device.gpu_model import JobActivity
from node_actor.emulated_device import EmulatedNodeDevices
from node_actor.emulated_job import CHECKPOINT_FILE, mps_memory_limits

SCALE = 0.01  # wall seconds per emulated second


@pytest.fixture
def device_dir(tmp_path):
    EmulatedNodeDevices(tmp_path / "dev", "A100-40GB", 1, time_scale=SCALE)
    return tmp_path / "dev"


def _job(device_dir, job_id, *extra, peak=2000, duration=100, tick=0.05):
    return [sys.executable, "-m", "node_actor.emulated_job", "--device-dir", str(device_dir), "--job-id", job_id,
            "--gpus", "0", "--peak-mib", str(peak), "--duration-s", str(duration), "--tick-s", str(tick), *extra]


def _used(device_dir) -> float:
    return EmulatedNodeDevices.open(device_dir).samples()[0].memory_used_mib


def test_oom_prints_pytorch_text_exits_1_and_frees_its_memory(device_dir):
    with EmulatedNodeDevices.open(device_dir).locked() as state:  # a neighbour holds 30 GB
        state.gpu(0).attach("neighbour", JobActivity(0.3))
        state.gpu(0).allocate_peak("neighbour", 30000)
    proc = subprocess.run(_job(device_dir, "big", peak=20000, duration=50), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in proc.stderr
    failure = classify_failure(proc.returncode, proc.stdout + proc.stderr)
    assert failure is not None and failure.kind == "oom"
    assert _used(device_dir) == pytest.approx(30000, abs=2)  # the neighbour kept everything


def test_mps_memory_limit_fails_the_job_itself(device_dir, tmp_path):
    peak_file = tmp_path / "peak"
    proc = subprocess.run(_job(device_dir, "liar", "--mem-limit-mib", "4048", "--peak-file", str(peak_file),
                               peak=20000, duration=50), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "MPS pinned device memory limit 4048 MiB" in proc.stderr
    assert float(peak_file.read_text()) > 4048  # what it held plus what it tried to get
    assert _used(device_dir) == 0


def test_limit_comes_from_the_mps_environment_like_a_real_client(device_dir):
    env = {**os.environ, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6000M"}
    over = subprocess.run(_job(device_dir, "over", peak=8000, duration=50), env=env, capture_output=True, text=True,
                          timeout=60)
    assert over.returncode == 1 and "MPS pinned device memory limit 6000 MiB" in over.stderr
    assert mps_memory_limits("0=6000M,1=2G", 2) == [6000.0, 2048.0]
    assert mps_memory_limits("", 2) == [None, None]
    with pytest.raises(ValueError, match="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"):
        mps_memory_limits("0=lots", 1)


def test_sigusr1_checkpoints_then_the_next_run_resumes(device_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    argv = _job(device_dir, "trainer", "--checkpoint-dir", str(ckpt), "--warmup-s", "5", duration=400)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while _used(device_dir) < 2000 and time.time() < deadline:  # running and past its warm-up
        time.sleep(0.05)
    time.sleep(1.0)  # ~100 emulated s of 400
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == REQUEUE_EXIT_CODE, out
    saved = json.loads((ckpt / CHECKPOINT_FILE).read_text())["progress_s"]
    assert 0 < saved < 400
    assert _used(device_dir) == 0
    resumed = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from checkpoint" in resumed.stdout and "progress 100%" in resumed.stdout
    reported = [int(line.split()[1].rstrip("%")) for line in resumed.stdout.splitlines() if line.startswith("progress")]
    assert reported[0] > 100 * saved / 400  # it went on from the checkpoint, not from zero


def test_sigterm_detaches_and_exits_143(device_dir):
    proc = subprocess.Popen(_job(device_dir, "victim", "--warmup-s", "1", peak=8000, duration=1000))
    deadline = time.time() + 10
    while _used(device_dir) < 8000 and time.time() < deadline:
        time.sleep(0.05)
    assert _used(device_dir) == pytest.approx(8000, abs=2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 143
    assert _used(device_dir) == 0


def test_command_output_and_exit_code_are_real(device_dir):
    ok = subprocess.run(_job(device_dir, "cmd-ok", "--", sys.executable, "-c", "print('from the command')", duration=30),
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "from the command" in ok.stdout
    bad = subprocess.run(_job(device_dir, "cmd-bad", "--", sys.executable, "-c", "import sys; sys.exit(3)", duration=300),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 3
    missing = subprocess.run(_job(device_dir, "cmd-missing", "--", "no-such-command-hs"), capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 127 and "cannot start command 'no-such-command-hs'" in missing.stderr
    assert _used(device_dir) == 0


def test_without_duration_the_job_lasts_as_long_as_its_command(device_dir):
    argv = [sys.executable, "-m", "node_actor.emulated_job", "--device-dir", str(device_dir), "--job-id", "cmd-only",
            "--gpus", "0", "--peak-mib", "5120", "--warmup-s", "0", "--",
            sys.executable, "-c", "import time; time.sleep(1.0)"]
    t0 = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert 1.0 <= time.time() - t0 < 10
