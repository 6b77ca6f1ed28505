"""The checkpoint-signal protocol for Hugging Face's ``transformers.Trainer``.

    import hier_sched as hs
    from hier_sched.common.hf_checkpoint import CheckpointOnSignal, resume_checkpoint

    hs.install_checkpoint_handler()                  # first: until then SIGUSR1 kills the job
    args = TrainingArguments(output_dir=str(hs.checkpoint_dir()), ...)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[CheckpointOnSignal()])
    trainer.train(resume_from_checkpoint=resume_checkpoint(args.output_dir))   # None: a fresh start

When the checkpoint signal has arrived, ``CheckpointOnSignal`` has the Trainer save a checkpoint
(``output_dir/checkpoint-N``: model, optimizer, LR scheduler, random states, trainer state) at the
end of the current optimizer step, skipping an evaluation due then, and exits with
``REQUEUE_EXIT_CODE``. On the restart (``HIER_SCHED_RESUME=1``) ``resume_checkpoint`` names the
newest complete checkpoint, and the Trainer continues from its global step.

The Trainer writes a checkpoint's files in place, so a job killed mid-save leaves a half-written
``checkpoint-N``. The callback marks each checkpoint complete once the Trainer has written it and
its files are synced to disk (the periodic saves of ``save_steps`` too); ``resume_checkpoint``
resumes from marked ones only, and removes unmarked ones newer than it, which the Trainer would
otherwise save into again (or keep, rotating complete ones away, under ``save_total_limit``).

One process, or several whose every rank gets the signal at the same step boundary: the ranks do
not agree on the step among themselves. Imports transformers: only jobs that use it import this
module.
"""

from __future__ import annotations

import re
import shutil
import sys
import threading
from pathlib import Path

from transformers import (
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from hier_sched.common.checkpointing import (
    atomic_write,
    checkpoint_dir,
    checkpoint_requested,
    exit_for_requeue,
    fsync_file,
    install_checkpoint_handler,
    resuming,
)

__all__ = ["COMPLETE_MARKER", "CheckpointOnSignal", "resume_checkpoint"]

# Written into checkpoint-N last, after its files are on disk: a checkpoint without it is half-written.
COMPLETE_MARKER = ".hier_sched-complete"
_CHECKPOINT_NAME = re.compile(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)")


class CheckpointOnSignal(TrainerCallback):
    """Save and exit for requeue at the first step boundary after the checkpoint signal.

    Creating it installs the checkpoint-signal handler (when on the main thread) and checks the
    job's checkpoint directory (``hs.CheckpointDirError`` when ``HIER_SCHED_CHECKPOINT_DIR`` is
    unset or unwritable); the Trainer's ``output_dir`` must lie inside that directory, where a
    requeued job looks for its checkpoints."""

    def __init__(self) -> None:
        self.directory = checkpoint_dir()
        if threading.current_thread() is threading.main_thread():
            install_checkpoint_handler()
        self._saving_for_signal = False

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        output = Path(args.output_dir).resolve()
        if not output.is_relative_to(self.directory.resolve()):
            raise ValueError(
                f"TrainingArguments.output_dir={args.output_dir} is outside the job's checkpoint directory "
                f"{self.directory}: a requeued job resumes from there (output_dir=str(hs.checkpoint_dir()))"
            )
        if args.save_only_model:
            raise ValueError(
                "TrainingArguments.save_only_model=True saves no optimizer, scheduler or random states: "
                "a requeued job could not continue from its checkpoint"
            )

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if checkpoint_requested():
            self._saving_for_signal = True
            control.should_save = True
            control.should_evaluate = False  # the grace before the slot ends is for saving
        return control

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if state.is_world_process_zero:
            _mark_complete(Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}", state.global_step)
        if self._saving_for_signal:
            exit_for_requeue()
        return control


def resume_checkpoint(output_dir: str | Path | None = None) -> str | None:
    """What to pass as ``trainer.train(resume_from_checkpoint=...)``: when the job is resuming,
    the newest complete ``checkpoint-N`` in ``output_dir`` (default: ``hs.checkpoint_dir()``);
    None on a fresh start or when no complete checkpoint exists yet.

    Removes the half-written checkpoints newer than the one it returns (see the module's doc)."""
    if not resuming():
        return None
    directory = Path(output_dir) if output_dir is not None else checkpoint_dir()
    complete: dict[int, Path] = {}
    incomplete: dict[int, Path] = {}
    for path in directory.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        if (match := _CHECKPOINT_NAME.fullmatch(path.name)) and path.is_dir():
            found = complete if (path / COMPLETE_MARKER).is_file() else incomplete
            found[int(match[1])] = path
    newest = max(complete, default=-1)
    for step in sorted(step for step in incomplete if step > newest):
        print(f"hier_sched: removing {incomplete[step]}: its save did not finish", file=sys.stderr, flush=True)
        shutil.rmtree(incomplete[step])
    return str(complete[newest]) if complete else None


def _mark_complete(checkpoint: Path, step: int) -> None:
    if not checkpoint.is_dir():
        raise RuntimeError(f"the Trainer reported a save, but {checkpoint} does not exist")
    for path in checkpoint.rglob("*"):
        fsync_file(path)  # the files' data, and the directories' entries
    fsync_file(checkpoint.parent)  # checkpoint-N's own entry
    atomic_write(checkpoint / COMPLETE_MARKER, lambda fh: fh.write(f"{step}\n".encode()))
