"""LLM training steps as users write them, for ``hier-sched estimate --step examples.llm_steps:NAME``
(your own step, traced as written: ``estimators.user_step``). Each builds its model from a public
config (transformers; no weights, no download) and returns the step to run.

``tinyllama_full`` is the set-up of litgpt's config-hub row for TinyLlama-1.1B full fine-tuning
(``../shared/data/llm/litgpt_runs.csv``, run ``litgpt-hub-L76``: bf16 weights, gradients and
AdamW state, micro-batch 4 of 512 tokens, gradient accumulation; measured ``max_allocated``
13.13 GiB on an A10G). Its figures are in BENCHMARKS.md. ``transformers`` is not a dependency of
hier_sched: ``./run.sh cuda-cli estimate --step ...`` runs it in the venv that has it.
"""

from __future__ import annotations

import torch
import transformers
from torch.nn import functional as F

TINYLLAMA = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                 num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=2048,
                 hidden_act="silu", rope_theta=10000.0, rms_norm_eps=1e-05)


def tinyllama_full():
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINYLLAMA)).to("cuda", torch.bfloat16)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    micro_batches = 2  # of the run's 8: the second finds every gradient in place, as the eighth does

    def step():
        for _ in range(micro_batches):
            ids = torch.zeros(4, 512, dtype=torch.long, device="cuda")
            logits = model(input_ids=ids).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), ids.flatten()) / micro_batches
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step
