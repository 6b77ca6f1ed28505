"""LLM training set-ups: the spec's training section, the step traced at two depths and carried to
the model's, what fakes cannot run (a 4-bit base, paged optimizers) and sharding, and the
evaluation against measured runs. Small Llama-shaped configs: seconds on a CPU."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from hier_sched.core.spec import SpecError, TrainingSpec, parse_spec
from tests.helpers.libraries import field_library

# Each test traces a tiny model a few times: seconds alone, minutes on a machine shared by many jobs.
pytestmark = pytest.mark.timeout(600)

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": False, "max_position_embeddings": 256}


def setup(**fields) -> TrainingSpec:
    return TrainingSpec(**{"hf_model_type": "llama", "hf_config": TINY, "seq_len": 64, "micro_batch": 2,
                           "precision": "bf16", **fields})


@pytest.mark.parametrize("training,message", [
    ({"precision": "bf8"}, "training.precision"),
    ({"quantization": "nf4"}, "needs a peft method"),
    ({"world_size": 4}, "needs a sharding"),
    ({"sharding": "fsdp"}, "needs world_size >= 2"),
    ({"peft": "lora", "lora_targets": ["qkv"]}, "training.lora_targets"),
    ({"peft": "dora", "lora_targets": []}, "lora_targets: name at least one"),
    ({"peft": "ia3", "ia3_targets": []}, "ia3_targets: name at least one"),
    ({"seq_len": 0}, "training.seq_len"),
])
def test_a_bad_training_section_is_named(training, message):
    spec = {"name": "ft", "command": ["python", "train.py"],
            "training": {"hf_model_type": "llama", "seq_len": 512, **training}}
    with pytest.raises(SpecError, match=message):
        parse_spec(spec)


def test_a_training_section_is_accepted_with_its_defaults():
    job = parse_spec({"name": "ft", "command": ["python", "train.py"],
                      "training": {"hf_model_type": "llama", "hf_config": TINY, "seq_len": 512, "peft": "lora",
                                   "quantization": "nf4-dq", "optimizer": "paged_adamw", "checkpointing": "block"}})
    assert job.training.lora_targets == ("q", "v") and job.training.precision == "bf16-mixed"


transformers = field_library("transformers")

from estimators.llm_estimate import compose, estimate_llm
from estimators.llm_trace import _trace_at, trace_step


def test_the_step_carried_to_full_depth_matches_a_trace_at_that_depth():
    for s in (setup(), setup(peft="lora", lora_targets=("q", "k", "v", "o"), checkpointing="block"),
              setup(peft="lora", quantization="nf4", optimizer="paged_adamw")):
        carried, direct = trace_step(s), _trace_at(s, TINY["num_hidden_layers"])
        for phase, peak in direct.phase_peaks.items():
            assert carried.phase_peaks[phase] == pytest.approx(peak, rel=0.01), (s, phase)
        assert carried.param_bytes == direct.param_bytes and carried.trainable_bytes == direct.trainable_bytes


def test_each_part_of_the_set_up_moves_its_part_of_the_estimate():
    full, lora = estimate_llm(setup(grad_accum=2)), estimate_llm(setup(peft="lora", grad_accum=2))
    assert lora.parts["gradients"] < full.parts["gradients"] / 20  # a frozen base has no gradients
    assert lora.parts["optimizer_state"] < full.parts["optimizer_state"] / 20
    big = {"seq_len": 256, "micro_batch": 4}
    plain, checkpointed = estimate_llm(setup(**big)), estimate_llm(setup(checkpointing="block", **big))
    assert checkpointed.parts["activations"] < plain.parts["activations"] / 2
    nf4 = estimate_llm(setup(peft="lora", quantization="nf4", optimizer="paged_adamw"))
    bf16 = estimate_llm(setup(peft="lora"))
    assert nf4.parts["weights"] < bf16.parts["weights"] / 2 and nf4.parts["dequantize"] > 0
    assert nf4.parts["paged_optimizer_state"] > 0 and nf4.parts["optimizer_state"] == 0
    assert "nf4 counted" in nf4.method and "paged_adamw counted" in nf4.method
    assert nf4.quantity("max_allocated") < nf4.quantity("max_reserved") < nf4.quantity("process_total")


def test_a_4bit_matmul_holds_its_input_until_the_loop_drops_the_loss():
    import torch
    from torch.nn import functional as F

    from estimators.llm_model import build_llm

    built = build_llm(setup(peft="lora", quantization="nf4", optimizer="paged_adamw", micro_batch=2, seq_len=16), 2)
    model = built.model.to_empty(device="cpu")  # a tiny model: real tensors, so real lifetimes
    ids = torch.zeros(2, 16, dtype=torch.long)
    loss = F.cross_entropy(model(input_ids=ids).logits.float().flatten(0, 1), ids.flatten())
    # Each input once, in bf16: block 0's attention input needs no gradient (frozen embedding, LoRA on
    # q and v), its o_proj, MLP and down_proj inputs do; block 1 holds all four; then the head's input.
    hidden, inter = TINY["hidden_size"], TINY["intermediate_size"]
    per_token = (hidden + hidden + inter) + (3 * hidden + inter) + hidden
    assert built.held_inputs.total_bytes() == 2 * 16 * 2 * per_token
    loss.backward()
    assert built.held_inputs.total_bytes() == 2 * 16 * 2 * per_token  # not released by the backward
    del loss
    assert built.held_inputs.total_bytes() == 0


def test_a_4bit_base_peaks_beside_the_previous_micro_batch_s_held_inputs():
    from dataclasses import replace

    # Deep and wide beside its vocabulary, as the 7B models are: the held inputs outweigh the logits.
    big = {"seq_len": 256, "micro_batch": 4,
           "hf_config": {**TINY, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 16}}
    qlora = setup(peft="lora", quantization="nf4", optimizer="paged_adamw", **big)
    figures = trace_step(qlora)
    peaks = figures.phase_peaks
    assert peaks["next_micro_batch"] > peaks["forward_backward"]
    without = replace(figures, phase_peaks={k: v for k, v in peaks.items() if k != "next_micro_batch"})
    added = compose(qlora, figures, 0).quantity("max_allocated") - compose(qlora, without, 0).quantity("max_allocated")
    assert added * 2**20 == pytest.approx(peaks["next_micro_batch"] - peaks["forward_backward"], rel=0.01)
    plain = trace_step(setup(peft="lora", **big)).phase_peaks  # its last graph holds nothing after the backward
    assert plain["next_micro_batch"] <= plain["forward_backward"]


def test_a_4bit_weight_is_dequantized_to_fp16_then_cast_to_the_compute_dtype():
    qlora = setup(peft="lora", quantization="nf4", optimizer="paged_adamw")
    figures = trace_step(qlora)
    in_bf16 = compose(qlora, figures, 0).parts["dequantize"] * 2**20
    in_fp16 = compose(qlora.model_copy(update={"precision": "fp16"}), figures, 0).parts["dequantize"] * 2**20
    assert in_fp16 == pytest.approx(2 * figures.largest_quantizable_elements)  # the fp16 copy alone
    assert in_bf16 == pytest.approx(2 * in_fp16)  # and its bf16 cast beside it


def test_sharding_divides_what_each_rank_holds():
    s1 = setup(micro_batch=1)
    figures = trace_step(s1)
    alone = compose(s1, figures, 500)
    fsdp2 = compose(s1.model_copy(update={"sharding": "fsdp2", "world_size": 4}), figures, 500)
    assert fsdp2.parts["weights"] == pytest.approx(alone.parts["weights"] / 4, rel=0.01)
    assert fsdp2.parts["communication"] > 0 and "fsdp2 x4" in fsdp2.method
    ddp = compose(s1.model_copy(update={"sharding": "ddp", "world_size": 4}), figures, 500)
    assert ddp.quantity("max_allocated") > alone.quantity("max_allocated")


def _traced_as_peft_makes_it(setup_of, peft_config):
    """The peak tensor bytes of one training step of ``setup_of``'s model with our adapters, and of
    the same model adapted by PEFT itself, traced by the same tracer as users' steps."""
    import torch
    from torch.nn import functional as F

    from estimators.llm_model import build_llm
    from estimators.user_step import UserStep, trace_user_step

    field_library("peft")
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    def step_of(model):
        model = model.to_empty(device="cuda")
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
        ids = torch.zeros(setup_of.micro_batch, setup_of.seq_len, dtype=torch.long, device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=setup_of.precision == "bf16-mixed"):
                logits = model(input_ids=ids).logits
                loss = F.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
            del logits
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    def ours():
        return step_of(build_llm(setup_of, setup_of.hf_config["num_hidden_layers"]).model)

    def peft_s():
        config = AutoConfig.for_model("llama", **setup_of.hf_config)
        config._attn_implementation, config.use_cache = "sdpa", False
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        model.to(torch.bfloat16 if setup_of.precision == "bf16" else torch.float32)
        return step_of(get_peft_model(model, peft_config))

    return trace_user_step(UserStep(ours)).peak_live_bytes, trace_user_step(UserStep(peft_s)).peak_live_bytes


WIDER = {**TINY, "hidden_size": 256, "intermediate_size": 1024}


@pytest.mark.parametrize("precision,dropout", [("bf16", 0.05), ("bf16-mixed", 0.0)])
def test_dora_holds_what_peft_s_dora_holds(precision, dropout):
    from peft import LoraConfig

    dora = setup(peft="dora", precision=precision, lora_dropout=dropout, hf_config=WIDER, seq_len=256, micro_batch=4)
    ours, peft_s = _traced_as_peft_makes_it(dora, LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout,
                                                             target_modules=["q_proj", "v_proj"], use_dora=True))
    assert ours == pytest.approx(peft_s, rel=0.001)


def test_ia3_holds_what_peft_s_ia3_holds():
    from peft import IA3Config

    ia3 = setup(peft="ia3", precision="bf16-mixed", hf_config=WIDER, seq_len=256, micro_batch=4)
    ours, peft_s = _traced_as_peft_makes_it(ia3, IA3Config(task_type="CAUSAL_LM"))
    assert ours == pytest.approx(peft_s, rel=0.001)


def test_dora_keeps_more_than_lora_and_ia3_trains_least():
    big = {"seq_len": 256, "micro_batch": 4, "hf_config": WIDER}
    lora, dora, ia3 = (estimate_llm(setup(peft=p, **big)) for p in ("lora", "dora", "ia3"))
    # DoRA keeps the base and LoRA outputs for its magnitudes' gradients (and fp32 adapters)
    assert dora.parts["activations"] > lora.parts["activations"]
    assert ia3.parts["optimizer_state"] < lora.parts["optimizer_state"]


def test_a_full_fine_tune_under_flat_fsdp_peaks_where_its_root_gradient_is_assembled():
    # a vocabulary as large beside its blocks as Gemma-2B's (256k x 2048 beside 18 blocks), short sequences
    big_vocab = {"hf_config": {**TINY, "vocab_size": 65536}, "grad_accum": 4, "seq_len": 16, "micro_batch": 1,
                 "checkpointing": "block"}
    full = setup(**big_vocab)
    figures = trace_step(full)
    root = figures.param_bytes - figures.block_param_bytes * figures.layers
    fsdp = compose(full.model_copy(update={"sharding": "fsdp", "world_size": 4}), figures, 0)
    assert fsdp.phase == "backward_end"
    # the root still gathered; every gradient unsharded (accumulating), the root's twice more:
    # its pieces waiting for the last of them, and their concatenation
    assert fsdp.parts["communication"] * 2**20 == pytest.approx(root - root // 4)
    assert fsdp.parts["gradients"] * 2**20 == pytest.approx(figures.trainable_bytes + 2 * root)
    assert fsdp.quantity("max_allocated") == pytest.approx(sum(
        fsdp.parts[k] for k in ("weights", "gradients", "optimizer_state", "communication")))
    # per-parameter shards (fsdp2) and a frozen root (LoRA) make no flat root gradient
    assert compose(full.model_copy(update={"sharding": "fsdp2", "world_size": 4}), figures, 0).phase != "backward_end"
    lora = setup(**big_vocab, peft="lora", sharding="fsdp", world_size=4)
    assert compose(lora, trace_step(lora), 0).phase != "backward_end"


def _row(**fields) -> dict:
    base = {"run_id": "r1", "model": "tiny", "hf_model_type": "llama", "hf_config": json.dumps(TINY),
            "method": "lora", "quant": "none", "precision": "bf16", "optimizer": "AdamW", "micro_batch": "2",
            "seq_len": "64", "grad_checkpointing": "false", "grad_accum": "1", "n_gpus": "1", "sharding": "none",
            "lora_r": "8", "lora_alpha": "16", "lora_targets": "q,v", "gpu": "A10G", "gpu_memory_gib": "22.49",
            "metric": "max_allocated", "peak_gib_per_gpu": "0.01", "oom": "false", "doubtful": "false"}
    return {**base, **fields}


def test_evaluate_llm_reads_a_runs_csv_and_leaves_doubtful_rows_out_of_the_figures(tmp_path):
    from hier_sched.front.cli import main

    rows = [_row(), _row(run_id="r2", micro_batch="4", gpu_memory_gib="0.001", peak_gib_per_gpu="", oom="true"),
            _row(run_id="r3", doubtful="true", peak_gib_per_gpu="5"), _row(run_id="r4", metric="nvidia_smi")]
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    out = CliRunner().invoke(main, ["estimators", "evaluate", "--llm", "--data", str(path), "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert (report["rows"], report["estimated"], report["oom_rows"], report["oom_predicted_pct"]) == (3, 2, 1, 100)
    by_id = {r["run_id"]: r for r in report["row_results"]}
    assert by_id["r3"]["estimated_gib"] is not None  # shown, though not counted
    assert "metric 'nvidia_smi'" in by_id["r4"]["error"]
    assert set(by_id["r1"]["parts_mib"]) >= {"weights", "gradients", "optimizer_state", "activations", "logits_loss",
                                             "communication", "allocator", "baseline"}
    text = CliRunner().invoke(main, ["estimators", "evaluate", "--llm", "--data", str(path)])
    assert "2/3 rows estimated" in text.output
