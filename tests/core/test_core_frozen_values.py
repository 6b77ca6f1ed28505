"""Frozen values built fast are the values the class builds: equal, hashable, immutable, pickled alike."""

import dataclasses
import pickle

import pytest

from hier_sched.core.frozen_values import fast_builder
from hier_sched.core.gpu import GpuState, Risk, SharingMode, gpu_state


def test_a_gpu_state_built_fast_is_the_gpu_state_the_class_builds() -> None:
    args = ("n0", 3, 40536.0, 1200.0, "A100-40GB", "GPU-n0-3", Risk(0.4, 0.2, 0.1), 88.0, ("a", "b"), 1,
            SharingMode.MPS, None, 12.5, 300.0, (1, 2))
    fast, plain = gpu_state(*args), GpuState(*args)
    assert type(fast) is GpuState
    assert fast == plain and hash(fast) == hash(plain)
    assert pickle.loads(pickle.dumps(fast)) == plain
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.memory_used_mib = 0.0  # type: ignore[misc]
    assert gpu_state("n0", 0, 80.0, 0.0) == GpuState("n0", 0, 80.0, 0.0)  # defaults, as the class has them


def test_a_class_that_checks_its_values_after_init_gets_no_fast_builder() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            if self.value < 0:
                raise ValueError("negative")

    with pytest.raises(TypeError, match="__post_init__"):
        fast_builder(Checked)
