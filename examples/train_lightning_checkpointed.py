"""A Lightning job that honours the checkpoint signal of fixed time slots.

A small MLP learns a noisy regression on the CPU. It prints ``step N loss X`` after every
optimizer step.

    HIER_SCHED_CHECKPOINT_DIR=/tmp/ckpt python examples/train_lightning_checkpointed.py --steps 200
    # kill -USR1 <pid>   -> saves /tmp/ckpt/preempted.ckpt, exits 85 (hier_sched.REQUEUE_EXIT_CODE)
    HIER_SCHED_RESUME=1 HIER_SCHED_CHECKPOINT_DIR=/tmp/ckpt python examples/train_lightning_checkpointed.py --steps 200

The resumed run continues at step N + 1. Needs lightning.
"""

from __future__ import annotations

import argparse
import sys

import hier_sched as hs  # light: no torch, no Ray

# First thing: a checkpoint signal that arrives while the slow imports below run must not kill the job.
hs.install_checkpoint_handler()

import lightning.pytorch as pl
import torch
from torch import nn

from hier_sched.common.lightning_checkpoint import CheckpointOnSignal, resume_ckpt_path

FEATURES, SAMPLES = 16, 2048


class Regression(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 50, gamma=0.5)}


class PrintSteps(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        print(f"step {trainer.global_step} loss {outputs['loss'].item()!r}", flush=True)


def data(seed: int) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(SAMPLES, 1, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True,
                                       generator=generator)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    try:
        on_signal = CheckpointOnSignal()
    except hs.CheckpointDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pl.seed_everything(args.seed, verbose=False)
    trainer = pl.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[PrintSteps(), on_signal])
    checkpoint = resume_ckpt_path()
    print(f"resuming from {checkpoint}" if checkpoint else f"starting at step 1 of {args.steps}", flush=True)
    trainer.fit(Regression(args.lr), data(args.seed), ckpt_path=checkpoint)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
