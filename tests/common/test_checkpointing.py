"""The job's side of the checkpoint-signal protocol: a real training script is preempted by a
real SIGUSR1, exits with the requeue code, and resumes with the very losses of an uninterrupted
run; checkpoints survive a crash or SIGTERM mid-save; the checkpoint directory is checked."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT

import hier_sched as hs
from hier_sched.common.torch_checkpoint import CHECKPOINT_FILE
from hier_sched.core.failures import classify_failure
from tests.helpers.signalled_run import run_until_signalled

EXAMPLE = ROOT / "examples" / "train_checkpointed.py"
STEPS = 300
SIGNAL_AFTER_STEP = 100
STEP_LINE = re.compile(r"^step (\d+) loss (\S+)$")


def _env(checkpoint_dir: Path, *, resume: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (hs.RESUME_ENV, hs.CHECKPOINT_DIR_ENV)}
    env[hs.CHECKPOINT_DIR_ENV] = str(checkpoint_dir)
    if resume:
        env[hs.RESUME_ENV] = "1"
    return env


def _losses(stdout: str) -> dict[int, str]:
    """step -> the loss exactly as printed (repr of the float: equal text is equal bits)."""
    return {int(m[1]): m[2] for m in map(STEP_LINE.match, stdout.splitlines()) if m}


def _train(checkpoint_dir: Path, *, resume: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EXAMPLE), "--steps", str(STEPS)], env=_env(checkpoint_dir, resume=resume),
                          capture_output=True, text=True, timeout=120)


def _train_until_signalled(checkpoint_dir: Path) -> tuple[int, str, str]:
    """Run the example and send it SIGUSR1 once it printed step SIGNAL_AFTER_STEP."""
    return run_until_signalled([sys.executable, str(EXAMPLE), "--steps", str(STEPS)], _env(checkpoint_dir),
                               f"step {SIGNAL_AFTER_STEP}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, str]:
    run = _train(tmp_path_factory.mktemp("uninterrupted"))
    assert run.returncode == 0, run.stderr
    losses = _losses(run.stdout)
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


@pytest.mark.timeout(400)  # three training processes (the module's fixture included), 120 s each at most
def test_preempted_run_resumes_at_the_next_step_with_identical_losses(tmp_path, uninterrupted):
    code, out, err = _train_until_signalled(tmp_path)
    assert code == hs.REQUEUE_EXIT_CODE, err
    # the scheduler's side reads this exit as "checkpointed, requeue me"
    assert classify_failure(code, out + err).kind == "checkpoint_requeue"
    first = _losses(out)
    stopped = max(first)
    assert SIGNAL_AFTER_STEP <= stopped < STEPS, "the signal lands mid-run"
    assert f"saved after step {stopped}" in out
    assert (tmp_path / CHECKPOINT_FILE).is_file()

    resumed = _train(tmp_path, resume=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming at step {stopped + 1} of {STEPS}" in resumed.stdout
    second = _losses(resumed.stdout)
    assert min(second) == stopped + 1, "resumes at the very next step"
    assert sorted(first) + sorted(second) == list(range(1, STEPS + 1))
    # bit for bit: same weights, optimizer moments, LR schedule and random draws after the restart
    assert {**first, **second} == uninterrupted


def _python(code: str, *, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def test_a_signal_before_the_handler_is_installed_kills_the_job():
    """SIGUSR1's default action: documented, and classified as a kill, not a requeue."""
    proc = _python("""
        import sys, time
        import hier_sched
        print("ready", flush=True)
        time.sleep(30)
    """)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGUSR1
    assert classify_failure(proc.returncode, out + err).kind == "killed"


def test_handler_light_import_chaining_and_requeue_exit():
    """The protocol needs neither torch nor Ray; a handler the job had keeps being called; the
    handler can only be installed from the main thread."""
    proc = _python("""
        import signal, sys, threading, time
        import hier_sched as hs

        errors = []
        t = threading.Thread(target=lambda: errors.append(_try()))
        def _try():
            try:
                hs.install_checkpoint_handler()
            except RuntimeError as exc:
                return str(exc)
        t.start(); t.join()
        print("thread:", errors[0], flush=True)

        own = []
        signal.signal(signal.SIGUSR1, lambda *_: own.append(1))
        hs.install_checkpoint_handler()
        assert not hs.checkpoint_requested()
        print("ready", flush=True)
        deadline = time.monotonic() + 30
        while not hs.checkpoint_requested() and time.monotonic() < deadline:
            time.sleep(0.01)
        print("own handler called:", own == [1], flush=True)
        print("heavy modules:", sorted({"torch", "ray"} & set(sys.modules)), flush=True)
        hs.exit_for_requeue()
    """)
    assert "must be called from the main thread" in proc.stdout.readline()
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == hs.REQUEUE_EXIT_CODE, err
    assert "own handler called: True" in out
    assert "heavy modules: []" in out
    assert f"exiting with code {hs.REQUEUE_EXIT_CODE}" in err


# --------------------------------------------------------------------------- the directory
def test_checkpoint_dir_unset_names_the_variable(monkeypatch):
    monkeypatch.delenv(hs.CHECKPOINT_DIR_ENV, raising=False)
    with pytest.raises(hs.CheckpointDirError, match=f"{hs.CHECKPOINT_DIR_ENV} is not set"):
        hs.checkpoint_dir()


def test_checkpoint_dir_is_created(monkeypatch, tmp_path):
    monkeypatch.setenv(hs.CHECKPOINT_DIR_ENV, str(tmp_path / "a" / "b"))
    assert hs.checkpoint_dir() == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b").is_dir()


def test_checkpoint_dir_that_cannot_be_made_names_it(monkeypatch, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv(hs.CHECKPOINT_DIR_ENV, str(tmp_path / "file" / "ckpt"))
    with pytest.raises(hs.CheckpointDirError, match=r"file/ckpt: the checkpoint directory cannot be written"):
        hs.checkpoint_dir()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_checkpoint_dir_is_refused(monkeypatch, tmp_path):
    tmp_path.chmod(0o500)
    try:
        monkeypatch.setenv(hs.CHECKPOINT_DIR_ENV, str(tmp_path))
        with pytest.raises(hs.CheckpointDirError, match="cannot be written"):
            hs.checkpoint_dir()
    finally:
        tmp_path.chmod(0o700)


def test_resuming_only_when_the_scheduler_says_so(monkeypatch):
    monkeypatch.delenv(hs.RESUME_ENV, raising=False)
    assert not hs.resuming()
    monkeypatch.setenv(hs.RESUME_ENV, "0")
    assert not hs.resuming()
    monkeypatch.setenv(hs.RESUME_ENV, "1")
    assert hs.resuming()


# --------------------------------------------------------------------------- atomic saves
def _tiny(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    return model, optimizer, scheduler


def _step(model, optimizer, scheduler):
    loss = model(torch.randn(3, 4)).pow(2).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()


def test_restore_without_a_checkpoint_is_step_zero(tmp_path):
    model, optimizer, scheduler = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert hs.TrainingCheckpoint(model, optimizer, scheduler, directory=tmp_path / "new").restore() == 0
    assert (tmp_path / "new").is_dir()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_save_restore_round_trip_with_rng_and_extra(tmp_path):
    model, optimizer, scheduler = _tiny()
    for _ in range(3):
        _step(model, optimizer, scheduler)
    hs.TrainingCheckpoint(model, optimizer, scheduler, directory=tmp_path).save(3, best_loss=0.25, epoch=1)
    expected = (torch.rand(5), np.random.rand(5), [random.random() for _ in range(5)])
    _step(model, optimizer, scheduler)
    saved_after = {k: v.clone() for k, v in model.state_dict().items()}

    other, other_opt, other_sched = _tiny(seed=1)
    torch.manual_seed(99), np.random.seed(99), random.seed(99)
    ckpt = hs.TrainingCheckpoint(other, other_opt, other_sched, directory=tmp_path)
    assert ckpt.restore() == 3
    assert ckpt.extra == {"best_loss": 0.25, "epoch": 1}
    assert other_sched.last_epoch == 3 and other_opt.param_groups[0]["lr"] == pytest.approx(0.01)
    drawn = (torch.rand(5), np.random.rand(5), [random.random() for _ in range(5)])
    assert torch.equal(drawn[0], expected[0]) and np.array_equal(drawn[1], expected[1]) and drawn[2] == expected[2]
    # the same next step from the restored state (optimizer momentum included)
    torch.manual_seed(7)
    _step(other, other_opt, other_sched)
    model2, opt2, sched2 = _tiny()
    hs.TrainingCheckpoint(model2, opt2, sched2, directory=tmp_path).restore()
    torch.manual_seed(7)
    _step(model2, opt2, sched2)
    assert all(torch.equal(v, model2.state_dict()[k]) for k, v in other.state_dict().items())
    assert not all(torch.equal(v, other.state_dict()[k]) for k, v in saved_after.items())


def test_restore_refuses_a_scheduler_mismatch_and_a_foreign_file(tmp_path):
    model, optimizer, scheduler = _tiny()
    hs.TrainingCheckpoint(model, optimizer, scheduler, directory=tmp_path).save(1)
    with pytest.raises(RuntimeError, match="saved with an LR scheduler, but this run has none"):
        hs.TrainingCheckpoint(model, optimizer, directory=tmp_path).restore()
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"garbage")
    with pytest.raises(RuntimeError, match=f"{CHECKPOINT_FILE} is unreadable"):
        hs.TrainingCheckpoint(model, optimizer, scheduler, directory=tmp_path).restore()


def test_a_failed_save_keeps_the_last_good_checkpoint(tmp_path):
    model, optimizer, scheduler = _tiny()
    ckpt = hs.TrainingCheckpoint(model, optimizer, scheduler, directory=tmp_path)
    ckpt.save(5)

    def half_then_fail(fh):
        fh.write(b"half a checkpoint")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        hs.atomic_write(ckpt.path, half_then_fail)
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_FILE]
    assert hs.TrainingCheckpoint(*_tiny(), directory=tmp_path).restore() == 5


def test_a_process_killed_mid_save_leaves_the_last_good_checkpoint(tmp_path):
    model, optimizer, scheduler = _tiny()
    ckpt = hs.TrainingCheckpoint(model, optimizer, scheduler, directory=tmp_path)
    ckpt.save(5)
    proc = _python(f"""
        import os, signal
        import hier_sched as hs
        def crash(fh):
            fh.write(b"half a checkpoint"); fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        hs.atomic_write({str(ckpt.path)!r}, crash)
    """)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert len(list(tmp_path.glob(f".{CHECKPOINT_FILE}.*.tmp"))) == 1  # the crashed write's temporary
    assert hs.TrainingCheckpoint(*_tiny(), directory=tmp_path).restore() == 5
    ckpt.save(6)  # the next save clears the stray temporary
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_FILE]


def test_sigterm_during_a_save_lets_the_save_finish_first(tmp_path):
    target = tmp_path / "state.bin"
    proc = _python(f"""
        import os, signal
        import hier_sched as hs
        def slow(fh):
            fh.write(b"first half, ")
            os.kill(os.getpid(), signal.SIGTERM)  # the slot ended while saving
            fh.write(b"second half")
        hs.atomic_write({str(target)!r}, slow)
        print("survived SIGTERM", flush=True)
    """)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM  # SIGTERM still ends the job, after the save
    assert "survived" not in out
    assert target.read_bytes() == b"first half, second half"
