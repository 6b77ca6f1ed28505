"""A Hugging Face ``Trainer`` job that honours the checkpoint signal of fixed time slots.

A tiny GPT-2 (two layers, built from its config: no weights to download) learns to continue
random token sequences on the CPU. It prints ``step N loss X`` after every optimizer step.

    HIER_SCHED_CHECKPOINT_DIR=/tmp/ckpt python examples/train_hf_checkpointed.py --steps 60
    # kill -USR1 <pid>   -> saves /tmp/ckpt/checkpoint-N, exits 85 (hier_sched.REQUEUE_EXIT_CODE)
    HIER_SCHED_RESUME=1 HIER_SCHED_CHECKPOINT_DIR=/tmp/ckpt python examples/train_hf_checkpointed.py --steps 60

The resumed run continues at step N + 1. Needs transformers and accelerate.
"""

from __future__ import annotations

import argparse
import sys

import hier_sched as hs  # light: no torch, no Ray

# First thing: a checkpoint signal that arrives while the slow imports below run must not kill the job.
hs.install_checkpoint_handler()

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from hier_sched.common.hf_checkpoint import CheckpointOnSignal, resume_checkpoint

VOCAB, LENGTH, SAMPLES = 64, 16, 512


class RandomTokens(torch.utils.data.Dataset):
    """Fixed random sequences, the same in every run (seeded)."""

    def __init__(self, seed: int) -> None:
        self.ids = torch.randint(0, VOCAB, (SAMPLES, LENGTH), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class PrintSteps(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            print(f"step {state.global_step} loss {logs['loss']!r}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    try:
        on_signal = CheckpointOnSignal()
    except hs.CheckpointDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2))
    training = TrainingArguments(
        output_dir=str(hs.checkpoint_dir()), max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3, seed=args.seed, use_cpu=True, logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=training, train_dataset=RandomTokens(args.seed),
                      callbacks=[PrintSteps(), on_signal])
    checkpoint = resume_checkpoint(training.output_dir)
    print(f"resuming from {checkpoint}" if checkpoint else f"starting at step 1 of {args.steps}", flush=True)
    trainer.train(resume_from_checkpoint=checkpoint)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
