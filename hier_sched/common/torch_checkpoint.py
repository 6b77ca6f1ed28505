"""Save and restore a PyTorch training loop across preemptions (the checkpoint-signal protocol).

    import hier_sched as hs

    ckpt = hs.TrainingCheckpoint(model, optimizer, scheduler)   # directory: HIER_SCHED_CHECKPOINT_DIR
    start = ckpt.restore() if hs.resuming() else 0              # steps already done (0: none saved)
    for step in range(start, steps):
        loss = train_one_step()
        if hs.checkpoint_requested():
            ckpt.save(step + 1)                                 # steps done so far
            hs.exit_for_requeue()
    ckpt.save(steps)

One file holds everything a loop needs to continue exactly where it stopped: the model's,
optimizer's and LR scheduler's state dicts, the step count, the random number generators' states
(torch CPU; CUDA when the job used it; numpy's global generator; Python's ``random``) and any
``extra`` values. A restored run draws the same random numbers as an uninterrupted one would, so
with deterministic kernels its losses are identical to the last bit.

Writes are atomic (``hier_sched.atomic_write``): an interrupted save leaves the previous checkpoint
intact. In a multi-process job, let one rank save (all ranks hold the same model after a
DistributedDataParallel step); all ranks restore.

This module imports torch; ``import hier_sched`` loads it only on first use of its names.
"""

from __future__ import annotations

import os
import pickle
import random
import threading
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hier_sched.common.checkpointing import atomic_write, checkpoint_dir, install_checkpoint_handler

__all__ = ["CHECKPOINT_FILE", "TrainingCheckpoint"]

CHECKPOINT_FILE = "training_checkpoint.pt"
_FORMAT = 1  # bumped when the file's layout changes, so an old file is refused by name


class TrainingCheckpoint:
    """The checkpoint of one training loop, in ``directory`` (created if missing; default:
    ``hs.checkpoint_dir()``).

    Creating it installs the checkpoint-signal handler (when on the main thread), so a signal
    that arrives during a slow start-up is not fatal."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        *,
        directory: str | os.PathLike[str] | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        if directory is None:
            directory = checkpoint_dir()
        Path(directory).mkdir(mode=0o700, parents=True, exist_ok=True)  # created private
        self.path = Path(directory) / CHECKPOINT_FILE
        self.extra: dict[str, Any] = {}  # the ``extra`` values of the last save or restore
        if _on_main_thread():
            install_checkpoint_handler()

    def save(self, step: int, **extra: Any) -> Path:
        """Save everything, atomically. ``step``: how many steps are done (``restore`` returns it,
        the index of the next step to run). ``extra``: tensors and plain values (numbers, strings,
        lists, dicts) such as the best loss so far or a data loader's position."""
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int (got {step!r})")
        state = {
            "format": _FORMAT,
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "rng": _rng_state(),
            "extra": extra,
        }
        self.extra = extra
        return atomic_write(self.path, lambda fh: torch.save(state, fh))

    def restore(self, *, weights_only: bool = True) -> int:
        """Load the checkpoint into the model, optimizer, scheduler and random generators and
        return its step count; 0 (nothing changed) when there is none yet.

        ``weights_only=True`` (torch's safe loader) accepts tensors and plain values only; pass
        ``False`` for a trusted file whose ``extra`` holds other objects."""
        if not self.path.is_file():
            return 0
        if not zipfile.is_zipfile(self.path):  # what torch.save writes; anything else is foreign
            raise RuntimeError(f"checkpoint {self.path} is unreadable: not a file written by torch.save")
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=weights_only)
        except pickle.UnpicklingError as exc:
            raise RuntimeError(
                f"checkpoint {self.path} holds objects the safe loader refuses (in extra?); "
                f"restore(weights_only=False) loads it if you trust the file: {exc}"
            ) from None
        except (EOFError, RuntimeError) as exc:
            raise RuntimeError(f"checkpoint {self.path} is unreadable: {exc}") from None
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise RuntimeError(f"checkpoint {self.path} is not a hier_sched training checkpoint (format {_FORMAT})")
        if (state["scheduler"] is None) != (self.scheduler is None):
            raise RuntimeError(
                f"checkpoint {self.path} was saved {'without' if state['scheduler'] is None else 'with'} "
                f"an LR scheduler, but this run has {'one' if self.scheduler is not None else 'none'}"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(state["rng"])
        self.extra = state["extra"]
        return int(state["step"])


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    return {
        "torch": torch.get_rng_state(),
        # only when the job used CUDA: querying it otherwise would create a context on every GPU
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        # numpy's state as a tensor and plain numbers, which torch's safe loader accepts
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached_gaussian)),
        "python": random.getstate(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        if len(state["cuda"]) != torch.cuda.device_count():
            raise RuntimeError(
                f"the checkpoint holds CUDA random states for {len(state['cuda'])} GPUs, "
                f"this run sees {torch.cuda.device_count()}"
            )
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached_gaussian))
    random.setstate(state["python"])
