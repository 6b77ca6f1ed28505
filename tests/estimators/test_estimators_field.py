"""The trace path as users meet it: under whichever build of torch runs these tests (``./run.sh test``
runs this file under the CPU wheel and again under the CUDA build GPU users install), from a
process that has run autograd itself, on timm and Hugging Face models built from configs (no weights).

The tracing worker's own failure handling is here too: a trace that kills its process, a worker
that dies between estimates, a model that cannot be sent to the worker.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys

import pytest
import torch
from torch import nn

from estimators import estimate_memory, trace_worker
from estimators.trace_estimator import TraceFailed, run_trace
from tests.helpers.libraries import field_library


def conv_pool_linear() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


# A user's script: it has traced a model in its own process first (a fake-tensor backward, what the
# tracer used to run in the caller to warm up), which under a CUDA build of torch leaves autograd
# in a state that no forked child of the process can use. Run as a fresh interpreter, so that
# nothing this test session did before changes what the script's process has run.
_USER_SCRIPT = """
import functools, sys
from torch import nn
from estimators import estimate_memory
from estimators.tracer import trace_training

trace_training(lambda: nn.Linear(2, 2), batch_size=1, input_shape=(2,), iterations=1)
if sys.argv[1] == "timm":
    import timm
    model = functools.partial(timm.create_model, "resnet18", pretrained=False)
    shape = tuple(timm.models.get_pretrained_cfg("resnet18").input_size)
else:
    model = lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    shape = (3, 32, 32)
est = estimate_memory(model, batch_size=16, input_shape=shape, optimizer="sgd", state_dir=sys.argv[2])
print(est.method)
print(est.peak_mib)
"""


def estimate_in_a_user_script(model: str, tmp_path) -> tuple[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", _USER_SCRIPT, model, str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    method, peak = done.stdout.strip().splitlines()[-2:]
    return method, float(peak)


@pytest.mark.timeout(600)  # the user script may take 300 s
def test_a_small_network_is_traced_in_a_process_that_ran_autograd(tmp_path):
    method, peak = estimate_in_a_user_script("small", tmp_path)
    assert method == "auto:trace", f"torch {torch.__version__}: {method}"
    # 314 parameters and 16 small images: the CUDA context's baseline (510 MiB on the default
    # A100-40GB) plus a few MiB of tensors, cuDNN workspaces and the margin
    assert 510 < peak < 700


@pytest.mark.timeout(600)  # the user script may take 300 s
def test_a_timm_model_is_traced_in_a_process_that_ran_autograd(tmp_path):
    field_library("timm")
    method, peak = estimate_in_a_user_script("timm", tmp_path)
    assert method == "auto:trace", f"torch {torch.__version__}: {method}"
    # resnet18: 11.7 M parameters (weights, gradients, momentum: 134 MiB) and 16 images' activations
    assert 600 < peak < 4000


def test_a_timm_model_is_traced_in_this_process(tmp_path):
    timm = field_library("timm")
    cfg = timm.models.get_pretrained_cfg("resnet18")
    est = estimate_memory(functools.partial(timm.create_model, "resnet18", pretrained=False), batch_size=16,
                          input_shape=tuple(cfg.input_size), optimizer="sgd", state_dir=str(tmp_path))
    assert est.method == "auto:trace", f"torch {torch.__version__}: {est.method}"
    # resnet18: 11.7 M parameters (weights, gradients, momentum: 134 MiB) and 16 images' activations
    assert 600 < est.peak_mib < 4000


def test_a_hugging_face_model_from_a_config_is_traced(tmp_path):
    transformers = field_library("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=256)
    est = estimate_memory(lambda: transformers.GPT2LMHeadModel(config), batch_size=4, input_shape=(64,),
                          state_dir=str(tmp_path))
    assert est.method.startswith("auto:trace"), f"torch {torch.__version__}: {est.method}"
    # while backward runs, every weight and its gradient are live (fp32: 8 bytes a parameter);
    # the rest (Adam's moments, 4 x 64 tokens' activations) is a few MiB for this 2-layer model
    params = sum(p.numel() for p in transformers.GPT2LMHeadModel(config).parameters())
    assert est.parts.tensors_mib >= 8 * params / 2**20
    assert est.parts.baseline_mib < est.peak_mib < est.parts.baseline_mib + 256


def _assert_conv_pool_linear_traced(result) -> None:
    """``conv_pool_linear`` on 2 images of 3 x 8 x 8: what its trace must have seen."""
    params = (3 * 8 * 3 * 3 + 8) + (8 * 10 + 10)
    assert result.param_bytes == 4 * params
    # live at once at the peak: at least the weights, the input and the convolution's output
    assert 4 * (params + 2 * 3 * 8 * 8 + 2 * 8 * 6 * 6) <= result.peak_live_bytes <= result.peak_allocated_bytes
    # the caching allocator reserves whole 2 MiB segments for small blocks
    assert result.peak_allocated_bytes <= result.peak_reserved_bytes and result.peak_reserved_bytes % (2 << 20) == 0


class _DiesInTheTracer(nn.Module):
    """Kills its own process once traced (as a fake-tensor abort does, pytorch#92627)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        os.kill(os.getpid(), signal.SIGABRT)


def test_a_trace_that_kills_its_process_is_reported_and_the_worker_lives_on():
    with pytest.raises(TraceFailed, match="tracer process died \\(signal 6\\)"):
        run_trace(_DiesInTheTracer, batch_size=2, input_shape=(4,))
    _assert_conv_pool_linear_traced(run_trace(conv_pool_linear, batch_size=2, input_shape=(3, 8, 8)))


def test_a_dead_worker_is_restarted_on_the_next_estimate():
    run_trace(conv_pool_linear, batch_size=2, input_shape=(3, 8, 8))
    worker = trace_worker._worker
    assert worker is not None
    worker.proc.kill()
    worker.proc.wait()
    _assert_conv_pool_linear_traced(run_trace(conv_pool_linear, batch_size=2, input_shape=(3, 8, 8)))
    assert trace_worker._worker is not worker


def test_a_model_that_cannot_be_sent_to_the_worker_falls_back_and_says_why(tmp_path):
    import threading

    class HoldsALock(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 4)
            self.lock = threading.Lock()

        def forward(self, x):
            return self.fc(x)

    with pytest.raises(TraceFailed, match="not picklable"):
        run_trace(HoldsALock(), batch_size=2, input_shape=(16,))
    est = estimate_memory(HoldsALock(), batch_size=2, input_shape=(16,), state_dir=str(tmp_path))
    assert est.method.startswith("auto:ml-mlp (trace failed: the model cannot be sent")
