"""A user's model module, written into a temporary project directory by the tests that need a
factory importable nowhere else: one that builds, ones that never return, fill the host's memory
or raise, and a model that builds but cannot be traced; and the directory that holds one."""

import textwrap
import uuid
from pathlib import Path

USER_MODELS = """
import torch
from torch import nn

def build():
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

def never():
    import time
    while True:
        time.sleep(1)

def hog():
    return bytearray(50 * 2**30)

def pid_then_never():
    import os, time
    with open(os.environ["HS_TEST_PID_FILE"], "w") as fh:
        fh.write(str(os.getpid()))
    while True:
        time.sleep(1)

def broken():
    raise ValueError("no such layer size")

class NoTrainingTrace(nn.Module):  # builds like any MLP; refuses to train on the tracer's fake tensors

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

    def forward(self, x):
        if type(x).__name__ == "FakeTensor" and torch.is_grad_enabled():
            raise RuntimeError("this model trains on real tensors only")
        return self.layers(x)

def untraceable():
    return NoTrainingTrace()
"""


def project_module(tmp_path_factory, source: str, prefix: str = "hs_models") -> tuple[Path, str]:
    """A project directory holding ``source`` as a module importable nowhere else: (its root, the
    module's name, unique to this run)."""
    root = tmp_path_factory.mktemp("project")
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    (root / f"{name}.py").write_text(textwrap.dedent(source))
    return root, name
