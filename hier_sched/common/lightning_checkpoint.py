"""The checkpoint-signal protocol for Lightning (``lightning.pytorch.Trainer``, Lightning 2.x).

    from hier_sched.common.lightning_checkpoint import CheckpointOnSignal, resume_ckpt_path

    on_signal = CheckpointOnSignal()                 # first: until then SIGUSR1 kills the job
    trainer = lightning.Trainer(max_steps=..., callbacks=[on_signal])
    trainer.fit(model, data, ckpt_path=resume_ckpt_path())   # None: a fresh start

When the checkpoint signal has arrived, ``CheckpointOnSignal`` saves a checkpoint with
``trainer.save_checkpoint`` (model, optimizers, LR schedulers, loop progress, callbacks' states)
after the current optimizer step, atomically, into ``HIER_SCHED_CHECKPOINT_DIR``, and exits with
``REQUEUE_EXIT_CODE``. On the restart (``HIER_SCHED_RESUME=1``) ``resume_ckpt_path`` names that
checkpoint and the Trainer continues from its global step.

Lightning has a SIGUSR1 handler of its own: under SLURM with ``SLURMEnvironment(auto_requeue=True)``
(its default) it saves an ``hpc_ckpt`` and calls ``scontrol requeue`` itself. Lightning installs
it only where no handler is installed yet, so creating this callback (which installs hier_sched's)
before the Trainer runs keeps Lightning's off: the scheduler, not SLURM, requeues the job.

In a multi-process job all ranks agree on the step to save at (the signal may reach them at
different steps); the strategy's own ``save_checkpoint`` decides what each rank writes. Imports
Lightning: only jobs that use it import this module.
"""

from __future__ import annotations

import threading
from pathlib import Path

import lightning.pytorch as pl

from hier_sched.common.checkpointing import (
    atomic_save,
    checkpoint_dir,
    checkpoint_requested,
    exit_for_requeue,
    install_checkpoint_handler,
    resuming,
)

__all__ = ["CHECKPOINT_FILE", "CheckpointOnSignal", "resume_ckpt_path"]

CHECKPOINT_FILE = "preempted.ckpt"  # not ModelCheckpoint's "last.ckpt", should its dirpath be the same directory


class CheckpointOnSignal(pl.Callback):
    """Save and exit for requeue at the first optimizer-step boundary after the checkpoint signal.

    Creating it installs the checkpoint-signal handler (when on the main thread) and checks the
    job's checkpoint directory (``hs.CheckpointDirError`` when ``HIER_SCHED_CHECKPOINT_DIR`` is
    unset or unwritable)."""

    def __init__(self) -> None:
        self.path = checkpoint_dir() / CHECKPOINT_FILE
        if threading.current_thread() is threading.main_thread():
            install_checkpoint_handler()
        self._steps_seen = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._steps_seen = trainer.global_step  # a resumed run starts past 0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if trainer.global_step == self._steps_seen:
            return  # accumulating gradients: no optimizer step yet, nothing a checkpoint could resume from
        self._steps_seen = trainer.global_step
        # every rank takes part (a collective under a distributed strategy): save if any rank got the signal
        if not trainer.strategy.reduce_boolean_decision(checkpoint_requested(), all=False):
            return
        if trainer.is_global_zero:
            atomic_save(self.path, trainer.save_checkpoint)
        else:
            trainer.save_checkpoint(self.path)  # the other ranks' part of the save; rank 0 writes the file
        print(f"hier_sched: saved {self.path} at global step {trainer.global_step}", flush=True)
        exit_for_requeue()


def resume_ckpt_path(directory: str | Path | None = None) -> str | None:
    """What to pass as ``trainer.fit(..., ckpt_path=...)``: when the job is resuming, the
    checkpoint ``CheckpointOnSignal`` saved in ``directory`` (default: ``hs.checkpoint_dir()``);
    None on a fresh start or when none was saved yet."""
    if not resuming():
        return None
    path = (Path(directory) if directory is not None else checkpoint_dir()) / CHECKPOINT_FILE
    return str(path) if path.is_file() else None
