"""A Ray job's runtime environment reaches the scheduled job: the spec carries it (validated at
submit), the launch plan passes it on, and the job's task runs with it and the scheduler's own
variables on top. How a spec submitted from a Ray job takes the job's: ``test_ray_job_env.py``;
end to end through ``ray job submit``: ``test_ray_surfaces.py``."""

from __future__ import annotations

import sys

import pytest

from hier_sched.common.messages import LaunchOrder, LaunchSpec
from hier_sched.core.events import Launch
from hier_sched.core.gpu import Placement
from hier_sched.core.placement import PlacementRequest
from hier_sched.core.spec import SpecError, parse_spec
from node_actor.launch_plan import NodeFacts, plan_launch
from node_actor.launcher import LaunchRequest, RunFiles, run_process

URI = "gcs://_ray_pkg_13866a120e33ec53.zip"


def test_the_schedulers_variables_win_over_the_runtime_envs(tmp_path, monkeypatch):
    """The job's task runs with the runtime_env's variables in its environment; the job's process
    gets the scheduler's on top."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # as a runtime_env's env_vars would set it
    monkeypatch.setenv("MINE", "1")
    files = RunFiles(str(tmp_path), 1)
    argv = (sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['MINE'])")
    assert run_process(LaunchRequest("j-1", argv, files, None, {"CUDA_VISIBLE_DEVICES": "0"})) == 0
    assert (tmp_path / "output.log").read_text().strip() == "0 1"


@pytest.mark.parametrize("runtime_env, problem", [
    ({"working_dir": "."}, "runtime_env: working_dir: '.' is not a URI"),
    ({"py_modules": ["gcs://ok.zip", "/home/me/lib"]}, "runtime_env: py_modules: '/home/me/lib' is not a URI"),
    ({"env_vars": {"A": 1}}, "runtime_env: env_vars: must map names to string values"),
])
def test_a_runtime_env_that_cannot_reach_the_nodes_is_refused_at_submit(runtime_env, problem):
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "x", "command": ["true"], "runtime_env": runtime_env})
    assert problem in str(err.value)


def _plan(spec: dict, tmp_path):
    launch = Launch("j-1", 1, (Placement("j-1", "n0", (0,), 3000.0),), None, PlacementRequest("j-1", 1, 3000.0))
    order = LaunchOrder(launch, 0, LaunchSpec.of(parse_spec(spec)))
    facts = NodeFacts("n0", ["GPU-0"], [40536.0], {}, 5120.0)
    return plan_launch(order, RunFiles(str(tmp_path), 1), facts)


def test_the_launch_request_carries_the_runtime_env(tmp_path):
    env = {"working_dir": URI, "env_vars": {"A": "1"}}
    planned = _plan({"name": "x", "command": ["python", "train.py"], "runtime_env": env}, tmp_path)
    assert planned.request.runtime_env == env and planned.request.argv == ("python", "train.py")


@pytest.mark.parametrize("runtime_env, python", [(None, sys.executable), ({"pip": ["six"]}, "python")])
def test_an_entrypoint_runs_on_the_jobs_own_python_when_its_runtime_env_brings_one(runtime_env, python, tmp_path):
    planned = _plan({"name": "x", "entrypoint": "pkg.mod:main", "runtime_env": runtime_env}, tmp_path)
    assert planned.request.argv[0] == python
