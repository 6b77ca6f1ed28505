"""A real training job that honours the checkpoint signal of fixed time slots.

A small MLP (with dropout, so the random generators matter) learns a noisy nonlinear regression
on the CPU: Adam, a step-decay learning rate, mini-batches drawn at random each step. It prints
``step N loss X`` (X exact, as Python's repr) after every step.

    HIER_SCHED_CHECKPOINT_DIR=/tmp/ckpt python examples/train_checkpointed.py --steps 600
    # kill -USR1 <pid>   -> saves, exits 85 (hier_sched.REQUEUE_EXIT_CODE)
    HIER_SCHED_RESUME=1 HIER_SCHED_CHECKPOINT_DIR=/tmp/ckpt python examples/train_checkpointed.py --steps 600

The resumed run continues at the next step, and its losses are those an uninterrupted run prints.
As a job spec: ``command: [python, examples/train_checkpointed.py]``, ``checkpoint_dir: ./ckpt``
and a ``slot``.
"""

from __future__ import annotations

import argparse
import sys

import hier_sched as hs  # light: no torch, no Ray

# First thing: a checkpoint signal that arrives while the slow imports below run must not kill the job.
hs.install_checkpoint_handler()

import torch  # noqa: E402
from torch import nn  # noqa: E402

FEATURES, HIDDEN, SAMPLES = 32, 128, 4096


def build(seed: int, lr: float) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler,
                                         torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES)
    w = torch.randn(FEATURES, 1) / FEATURES**0.5
    y = torch.sin(2 * x @ w) + 0.1 * torch.randn(SAMPLES, 1)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Dropout(0.1),
                          nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    return model, optimizer, scheduler, x, y


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    torch.set_num_threads(1)  # one thread: same summation order every run (and frugal)
    model, optimizer, scheduler, x, y = build(args.seed, args.lr)
    try:
        ckpt = hs.TrainingCheckpoint(model, optimizer, scheduler)
    except hs.CheckpointDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    start = ckpt.restore() if hs.resuming() else 0
    print(f"{'resuming at' if start else 'starting at'} step {start + 1} of {args.steps}", flush=True)

    model.train()
    for step in range(start, args.steps):
        batch = torch.randint(0, SAMPLES, (args.batch_size,))
        loss = nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"step {step + 1} loss {loss.item()!r}", flush=True)
        hs.report_progress(step + 1, args.steps)  # `hier-sched top` draws it (at most once a second)
        if hs.checkpoint_requested():
            ckpt.save(step + 1)
            print(f"checkpoint signal: saved after step {step + 1}", flush=True)
            hs.exit_for_requeue()
    ckpt.save(args.steps)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
