"""Hugging Face models from their default configurations (no weights, no download), as
zero-argument factories for ``hier-sched estimate --model examples.hf_models:NAME``.

``transformers`` is not a dependency of hier_sched; install it beside the project to use these,
e.g. ``pip install --target /tmp/hf "transformers<5"`` and ``PYTHONPATH=.:/tmp/hf``. They are the
unseen-architecture check of the trace path recorded in BENCHMARKS.md (Estimators).
"""

from __future__ import annotations

import transformers as hf


def bert_base():
    return hf.BertForSequenceClassification(hf.BertConfig())


def distilbert():
    return hf.DistilBertForSequenceClassification(hf.DistilBertConfig())


def roberta_base():
    return hf.RobertaForSequenceClassification(hf.RobertaConfig())


def gpt2():
    return hf.GPT2LMHeadModel(hf.GPT2Config())


def vit_base():
    return hf.ViTForImageClassification(hf.ViTConfig())


def llama_4_layers():
    """A small Llama (4 layers, 512 wide): the architecture of today's LLMs at a size that traces fast."""
    return hf.LlamaForCausalLM(hf.LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                                              num_attention_heads=8, num_key_value_heads=8, vocab_size=32000))


def resnet50():
    return hf.ResNetForImageClassification(hf.ResNetConfig())


def swin_tiny():
    return hf.SwinForImageClassification(hf.SwinConfig())


def convnext_tiny():
    return hf.ConvNextForImageClassification(hf.ConvNextConfig())
