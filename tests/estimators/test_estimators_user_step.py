"""The user's own training step, traced as written (``estimators.user_step``): the same bytes as the
generic loop when it does what the loop does, in either form (the step returned, or one step run);
CUDA code traced on CPU fakes; autocast and activation checkpointing seen; bad steps named; and
the step's estimate made in the tracing worker, for a callable and for ``"pkg.mod:fn"``."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from estimators.api import estimate_step
from estimators.job_estimate import estimate_for_request
from estimators.tracer import trace_training
from estimators.types import EstimatorError
from estimators.user_step import UserStep, trace_user_step
from global_queue.estimates import estimate_request, needs_model_estimate
from tests.helpers.libraries import field_library
from tests.helpers.user_models import project_module
from hier_sched.core.spec import JobSpec, SpecError, parse_spec

BATCH, WIDTH, CLASSES = 64, 512, 10


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, CLASSES))


def returns_its_step():
    return _step_of(mlp().cuda())


def _step_of(model: nn.Module):
    opt = torch.optim.Adam(model.parameters(), foreach=True)

    def step():
        x = torch.randn(BATCH, WIDTH, device="cuda")
        loss = F.cross_entropy(model(x), torch.randint(0, CLASSES, (BATCH,), device="cuda"))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def runs_one_step():
    model = mlp().to(torch.device("cuda"))
    opt = torch.optim.Adam(model.parameters(), foreach=True)
    x = torch.randn(BATCH, WIDTH, device="cuda:0")
    loss = F.cross_entropy(model(x), torch.randint(0, CLASSES, (BATCH,), device="cuda"))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_a_step_that_does_what_the_generic_loop_does_traces_the_same_bytes_in_both_forms():
    loop = trace_training(mlp, batch_size=BATCH, input_shape=(WIDTH,), optimizer="adam")
    returned = trace_user_step(UserStep(returns_its_step))
    ran_once = trace_user_step(UserStep(runs_one_step))
    # the targets are the only tensor made at another moment
    assert abs(returned.peak_live_bytes - loop.peak_live_bytes) <= 4096
    # one step run: its optimizer state moved to the start, as every later step finds it
    assert ran_once.peak_live_bytes == returned.peak_live_bytes
    assert returned.param_bytes == loop.param_bytes
    assert (returned.iterations, ran_once.iterations) == (2, 1)


def builds_on_meta_first():
    with torch.device("meta"):
        model = mlp()  # no memory until materialized: the pattern of large models and FSDP2
    return _step_of(model.to_empty(device="cuda"))


def test_a_model_built_on_meta_first_holds_nothing_until_materialized_and_traces_the_same_each_time():
    import gc

    direct = trace_user_step(UserStep(returns_its_step))
    # meta tensors in reference cycles die only when the collector runs: counted, they made the
    # figure depend on when it ran (24 MiB of a 90 MiB step, between two traces in one process)
    peaks = []
    for collector in (gc.enable, gc.disable):
        collector()
        try:
            peaks.append(trace_user_step(UserStep(builds_on_meta_first)).peak_live_bytes)
        finally:
            gc.enable()
    assert peaks == [direct.peak_live_bytes] * 2


class _Blocks(nn.Module):
    def __init__(self, recompute: bool):
        super().__init__()
        self.recompute = recompute
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
                                    for _ in range(4))

    def forward(self, x):
        for block in self.blocks:
            x = x + (checkpoint(block, x, use_reentrant=False) if self.recompute else block(x))
        return x


def _transformer_like(recompute: bool, autocast: bool):
    def build():
        device = "cuda" if torch.cuda.is_available() else "cpu"  # says cpu while traced
        model = _Blocks(recompute).to(device)
        opt = torch.optim.AdamW(model.parameters())
        scaler = torch.amp.GradScaler("cuda")  # disabled while traced: it scales nothing of the memory

        def step():
            x = torch.randn(8, 512, 1024, device=device)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
        return step
    return build


def test_autocast_and_activation_checkpointing_written_for_cuda_are_seen_in_the_trace():
    peak = {(r, a): trace_user_step(UserStep(_transformer_like(r, a))).peak_live_bytes
            for r in (False, True) for a in (False, True)}
    assert peak[False, True] < peak[False, False]  # bf16 activations
    assert peak[True, False] < peak[False, False]  # recomputed blocks keep only their inputs
    assert peak[True, True] < peak[True, False]


def test_a_step_that_returns_something_else_or_makes_nothing_is_named():
    with pytest.raises(EstimatorError, match=r"returned int: return the step to run"):
        trace_user_step(UserStep(lambda: 3))
    with pytest.raises(EstimatorError, match=r"made no tensor"):
        trace_user_step(UserStep(lambda: None))
    with pytest.raises(EstimatorError, match=r"training step must look like 'pkg.module:function'"):
        trace_user_step(UserStep("no_colon"))


def test_the_steps_estimate_is_made_in_the_tracing_worker_with_its_parts():
    est = estimate_step(UserStep(returns_its_step), gpu="A100-40GB")
    assert est.method == "auto:trace:user-step" and est.parts is not None
    assert est.parts.tensors_mib >= trace_user_step(UserStep(returns_its_step)).peak_live_bytes / 2**20
    assert est.peak_mib == pytest.approx(est.parts.total_mib())
    with pytest.raises(EstimatorError, match="method must be auto or trace"):
        estimate_step(UserStep(returns_its_step), method="horus")


STEP_MODULE = """
import torch
from torch import nn


def one_step():
    model = nn.Linear(256, 256).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(32, 256, device="cuda")).sum().backward()
    opt.step()


def broken():
    raise ValueError("no such dataset")
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return project_module(tmp_path_factory, STEP_MODULE, prefix="hs_steps")


def _spec(project, fn: str) -> JobSpec:
    root, name = project
    return parse_spec({"name": "own-step", "command": ["python", "train.py"], "workdir": str(root),
                       "model": {"step": f"{name}:{fn}"}})


def test_a_spec_names_its_step_and_the_queue_asks_for_it_where_the_jobs_code_lives(project):
    spec = _spec(project, "one_step")
    assert needs_model_estimate(spec)
    request = estimate_request(spec, ["A100-40GB", "H100-80GB"], timeout_s=60.0, host_budget_mib=2048.0)
    assert request["step"] == f"{project[1]}:one_step" and "batch_size" not in request  # the step makes its batch
    outcome = estimate_for_request(request, where="test")
    assert set(outcome["needs"]) == {"A100-40GB", "H100-80GB"}, outcome
    assert outcome["source"].startswith("auto:trace:user-step (test, ")
    assert project[1] not in sys.modules  # imported and traced in the worker's child only
    failed = estimate_for_request(estimate_request(_spec(project, "broken"), ["A100-40GB"], timeout_s=60.0,
                                                   host_budget_mib=2048.0))
    assert failed["reject"].startswith(f"model.step {project[1]}:broken: ") and "no such dataset" in failed["reject"]


def test_a_spec_with_both_a_factory_and_a_step_is_refused_naming_both():
    with pytest.raises(SpecError, match="factory .* or step .* not both"):
        parse_spec({"name": "x", "command": ["true"], "model": {"factory": "a:b", "step": "a:c"}})
    with pytest.raises(SpecError, match="model.step"):
        parse_spec({"name": "x", "command": ["true"], "model": {"step": "not a path"}})


def _llama_step(recompute: bool):
    def build():
        transformers = field_library("transformers")
        config = transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376,
                                          num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8)
        model = transformers.LlamaForCausalLM(config).cuda()  # from its config: no weights read
        if recompute:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        opt = torch.optim.AdamW(model.parameters())

        def step():
            ids = torch.zeros(2, 1024, dtype=torch.long, device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids=ids).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), ids.flatten())  # the user's own loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    return build


def test_a_hugging_face_llama_step_with_its_gradient_checkpointing_is_traced_as_written():
    plain = trace_user_step(UserStep(_llama_step(False)))
    recomputed = trace_user_step(UserStep(_llama_step(True)))
    assert recomputed.peak_live_bytes < plain.peak_live_bytes
    # weights, gradients and AdamW's two states: at least four copies of the fp32 parameters
    assert plain.peak_live_bytes > 4 * plain.param_bytes


def fsdp2_step():
    """A step written for a real multi-GPU job: NCCL, its rank's device, a mesh, FSDP2 per block."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh("cuda", (int(os.environ["WORLD_SIZE"]),))
    model = nn.Sequential(*[nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
                            for _ in range(4)]).cuda()
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters())

    def step():
        model(torch.randn(2, 512, 1024, device="cuda")).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def test_a_sharded_step_is_traced_as_rank_0_of_a_fake_world_holding_its_share():
    full = 4 * 2 * (1024 * 4096 * 4) + 4 * (4096 + 1024) * 4  # the blocks' fp32 weights and biases
    traced = {w: trace_user_step(UserStep(fsdp2_step, world_size=w)) for w in (1, 2, 8)}
    assert traced[1].param_bytes == full and traced[8].param_bytes == pytest.approx(full / 8, rel=0.01)
    # weights, gradients and AdamW's two states are a rank's share: the peak falls with the world by
    # about four eighths of the full weights, less what a gathered block and its buffers add
    drop = traced[1].peak_live_bytes - traced[8].peak_live_bytes
    assert 4 * full * (1 - 1 / 8) * 0.5 < drop <= 4 * full * (1 - 1 / 8)
    assert traced[8].peak_live_bytes < traced[2].peak_live_bytes < traced[1].peak_live_bytes


def fsdp1_step():
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    dist.init_process_group("nccl")
    model = FullyShardedDataParallel(nn.Linear(1024, 1024).cuda(), device_id=torch.cuda.current_device())
    opt = torch.optim.AdamW(model.parameters())

    def step():
        model(torch.randn(2, 1024, device="cuda")).sum().backward()
        opt.step()
    return step


def test_a_step_sharded_with_fsdp1_is_refused_naming_what_can_be_traced():
    with pytest.raises(EstimatorError, match=r"FSDP1 .* fully_shard .* training section \(sharding: fsdp\)"):
        trace_user_step(UserStep(fsdp1_step, world_size=2))
