"""Hugging Face's ``Trainer`` under the checkpoint-signal protocol: a real training process is sent a
real SIGUSR1, saves ``checkpoint-N``, exits with the requeue code, and its restart continues at
step N + 1; a half-written checkpoint is never resumed from.

Runs where transformers and accelerate are installed (``./run.sh test`` runs it in the CUDA-build
venv); skipped in the main venv."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT

import hier_sched as hs
from tests.helpers.libraries import field_library
from tests.helpers.signalled_run import run_until_signalled

field_library("transformers")
field_library("accelerate")  # what the Trainer needs

from hier_sched.common.hf_checkpoint import (
    COMPLETE_MARKER,
    CheckpointOnSignal,
    resume_checkpoint,
)

EXAMPLE = ROOT / "examples" / "train_hf_checkpointed.py"
STEPS = 80  # past the signal by more than a one-page pipe holds (the step line and the Trainer's log: ~120 bytes a step)
SIGNAL_AFTER_STEP = 5
STEP_LINE = re.compile(r"^step (\d+) loss \S+$", re.MULTILINE)


def _env(checkpoint_dir: Path, *, resume: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (hs.RESUME_ENV, hs.CHECKPOINT_DIR_ENV)}
    env[hs.CHECKPOINT_DIR_ENV] = str(checkpoint_dir)
    if resume:
        env[hs.RESUME_ENV] = "1"
    return env


def _steps(stdout: str) -> list[int]:
    return [int(step) for step in STEP_LINE.findall(stdout)]


@pytest.mark.slow
@pytest.mark.timeout(600)  # two training processes; importing the library alone takes a minute on a busy machine
def test_a_signalled_trainer_saves_exits_for_requeue_and_resumes_at_the_next_step(tmp_path):
    command = [sys.executable, str(EXAMPLE), "--steps", str(STEPS)]
    code, out, err = run_until_signalled(command, _env(tmp_path), f"step {SIGNAL_AFTER_STEP}")
    assert code == hs.REQUEUE_EXIT_CODE, err
    first = _steps(out)
    stopped = first[-1]
    assert first == list(range(1, stopped + 1))
    assert SIGNAL_AFTER_STEP <= stopped < STEPS, "saved at the first step boundary after the signal, mid-run"
    saved = tmp_path / f"checkpoint-{stopped}"
    assert (saved / COMPLETE_MARKER).read_text() == f"{stopped}\n"
    assert [p.name for p in tmp_path.glob("checkpoint-*")] == [saved.name]

    # a later save that was killed midway: every file there, but never marked complete
    half_written = tmp_path / f"checkpoint-{stopped + 3}"
    shutil.copytree(saved, half_written)
    (half_written / COMPLETE_MARKER).unlink()

    resumed = subprocess.run(command, env=_env(tmp_path, resume=True), capture_output=True, text=True, timeout=240,
                             check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {saved}\n" in resumed.stdout
    assert f"removing {half_written}" in resumed.stderr
    assert _steps(resumed.stdout) == list(range(stopped + 1, STEPS + 1)), "the global step continues"
    assert resumed.stdout.endswith("done\n")


def _checkpoint(directory: Path, step: int, *, complete: bool) -> Path:
    path = directory / f"checkpoint-{step}"
    path.mkdir()
    (path / "trainer_state.json").write_text("{}")
    if complete:
        (path / COMPLETE_MARKER).write_text(f"{step}\n")
    return path


def test_resume_checkpoint_takes_the_newest_complete_one_and_drops_newer_half_written_ones(tmp_path, monkeypatch):
    monkeypatch.setenv(hs.RESUME_ENV, "1")
    older_half = _checkpoint(tmp_path, 9, complete=False)
    _checkpoint(tmp_path, 10, complete=True)
    newest = _checkpoint(tmp_path, 20, complete=True)
    newer_half = _checkpoint(tmp_path, 25, complete=False)
    (tmp_path / "checkpoint-99").write_text("a file, not a checkpoint")
    (tmp_path / "checkpoint-best").mkdir()

    assert resume_checkpoint(tmp_path) == str(newest)
    assert not newer_half.exists()
    assert older_half.exists()  # the Trainer's rotation of old checkpoints deals with it


def test_resume_checkpoint_is_none_on_a_fresh_start_or_with_nothing_complete(tmp_path, monkeypatch):
    _checkpoint(tmp_path, 10, complete=True)
    monkeypatch.delenv(hs.RESUME_ENV, raising=False)
    assert resume_checkpoint(tmp_path) is None
    monkeypatch.setenv(hs.RESUME_ENV, "1")
    assert resume_checkpoint(tmp_path / "empty") is None

    monkeypatch.setenv(hs.CHECKPOINT_DIR_ENV, str(tmp_path / "job"))
    half = _checkpoint(hs.checkpoint_dir(), 3, complete=False)
    assert resume_checkpoint() is None  # default: the job's checkpoint directory
    assert not half.exists()


def _training_args(output_dir: Path, *, save_only_model: bool = False) -> SimpleNamespace:
    return SimpleNamespace(output_dir=str(output_dir), save_only_model=save_only_model)


def test_the_callback_refuses_an_output_dir_a_requeued_job_would_not_find(tmp_path, monkeypatch):
    monkeypatch.setenv(hs.CHECKPOINT_DIR_ENV, str(tmp_path / "job"))
    callback = CheckpointOnSignal()
    callback.on_train_begin(_training_args(tmp_path / "job" / "run1"), None, None)  # inside: fine
    with pytest.raises(ValueError, match="output_dir=.*elsewhere.* is outside the job's checkpoint directory"):
        callback.on_train_begin(_training_args(tmp_path / "elsewhere"), None, None)
    with pytest.raises(ValueError, match="save_only_model=True"):
        callback.on_train_begin(_training_args(tmp_path / "job", save_only_model=True), None, None)


def test_the_callback_needs_the_jobs_checkpoint_dir(monkeypatch):
    monkeypatch.delenv(hs.CHECKPOINT_DIR_ENV, raising=False)
    with pytest.raises(hs.CheckpointDirError, match=hs.CHECKPOINT_DIR_ENV):
        CheckpointOnSignal()
