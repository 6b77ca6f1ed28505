"""Lightning under the checkpoint-signal protocol: a real training process is sent a real SIGUSR1,
saves a checkpoint at an optimizer-step boundary, exits with the requeue code, and its restart
continues at the next global step; under SLURM, Lightning's own SIGUSR1 requeue stays off.

Runs where lightning is installed (``./run.sh test`` runs it in the CUDA-build venv); skipped in
the main venv."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

import hier_sched as hs
from tests.helpers.libraries import field_library
from tests.helpers.signalled_run import run_until_signalled

field_library("lightning")

from lightning.fabric.plugins.environments import SLURMEnvironment

from hier_sched.common.lightning_checkpoint import CHECKPOINT_FILE, resume_ckpt_path

EXAMPLE = ROOT / "examples" / "train_lightning_checkpointed.py"
STEPS = 200  # past the signal by more than the lines a one-page pipe holds (see signalled_run)
SIGNAL_AFTER_STEP = 5
STEP_LINE = re.compile(r"^step (\d+) loss \S+$", re.MULTILINE)
# What makes Lightning pick its SLURMEnvironment, whose auto_requeue is on by default.
SLURM_JOB = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "4242", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}


def _env(checkpoint_dir: Path, *, resume: bool = False, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in (hs.RESUME_ENV, hs.CHECKPOINT_DIR_ENV) and not k.startswith("SLURM_")}
    env[hs.CHECKPOINT_DIR_ENV] = str(checkpoint_dir)
    if resume:
        env[hs.RESUME_ENV] = "1"
    return {**env, **extra}


def _steps(stdout: str) -> list[int]:
    return [int(step) for step in STEP_LINE.findall(stdout)]


def _signalled(checkpoint_dir: Path, workdir: Path, **extra_env: str) -> int:
    """Run the example until the signal; the global step it saved at."""
    code, out, err = run_until_signalled([sys.executable, str(EXAMPLE), "--steps", str(STEPS)],
                                         _env(checkpoint_dir, **extra_env), f"step {SIGNAL_AFTER_STEP}", cwd=workdir)
    assert code == hs.REQUEUE_EXIT_CODE, err
    first = _steps(out)
    stopped = first[-1]
    assert first == list(range(1, stopped + 1))
    assert SIGNAL_AFTER_STEP <= stopped < STEPS, "saved at the first step boundary after the signal, mid-run"
    assert f"saved {checkpoint_dir / CHECKPOINT_FILE} at global step {stopped}\n" in out
    assert [p.name for p in checkpoint_dir.iterdir()] == [CHECKPOINT_FILE], "no temporary left behind"
    return stopped


@pytest.mark.slow
@pytest.mark.timeout(600)  # two training processes; importing the library alone takes a minute on a busy machine
def test_a_signalled_trainer_saves_exits_for_requeue_and_resumes_at_the_next_step(tmp_path):
    checkpoints = tmp_path / "ckpt"
    stopped = _signalled(checkpoints, tmp_path)

    resumed = subprocess.run([sys.executable, str(EXAMPLE), "--steps", str(STEPS)], cwd=tmp_path,
                             env=_env(checkpoints, resume=True), capture_output=True, text=True, timeout=240, check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {checkpoints / CHECKPOINT_FILE}\n" in resumed.stdout
    assert _steps(resumed.stdout) == list(range(stopped + 1, STEPS + 1)), "the global step continues"
    assert resumed.stdout.endswith("done\n")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_under_slurm_lightnings_own_requeue_stays_off(tmp_path, monkeypatch):
    """Lightning's SLURM handler would save an hpc_ckpt into the working directory and run
    ``scontrol requeue``; hier_sched's handler, installed first, keeps it from being installed."""
    for name, value in SLURM_JOB.items():
        monkeypatch.setenv(name, value)
    assert SLURMEnvironment.detect() and SLURMEnvironment().auto_requeue, "the job looks like a SLURM job to Lightning"
    checkpoints = tmp_path / "ckpt"
    _signalled(checkpoints, tmp_path, **SLURM_JOB)
    assert not list(tmp_path.rglob("hpc_ckpt*")), "Lightning's SLURM requeue handler ran"


def test_resume_ckpt_path_is_the_saved_checkpoint_only_when_resuming(tmp_path, monkeypatch):
    monkeypatch.setenv(hs.CHECKPOINT_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(hs.RESUME_ENV, "1")
    assert resume_ckpt_path() is None  # nothing saved yet
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"saved")
    assert resume_ckpt_path() == str(tmp_path / CHECKPOINT_FILE)
    assert resume_ckpt_path(tmp_path / "other") is None
    monkeypatch.delenv(hs.RESUME_ENV)
    assert resume_ckpt_path() is None
