"""A spec submitted from inside a Ray job takes the job's runtime environment, its own keys winning,
and a workdir inside the uploaded directory becomes relative to each node's copy of it
(hier_sched.front.ray_job_env). What the nodes do with it: ``test_launch_runtime_env.py``."""

from __future__ import annotations

import pytest

from hier_sched.front.ray_job_env import inherit_ray_job_env

URI = "gcs://_ray_pkg_13866a120e33ec53.zip"
COPY = "/tmp/ray/session_x/runtime_resources/working_dir_files/_ray_pkg_13866a120e33ec53"


def test_the_ray_jobs_env_goes_into_the_spec_and_the_specs_own_keys_win():
    job_env = {"working_dir": URI, "pip": ["six"], "env_vars": {"A": "job", "B": "job"}}
    spec = {"name": "x", "runtime_env": {"pip": ["requests"], "env_vars": {"B": "spec"}}, "workdir": COPY}
    data = inherit_ray_job_env(spec, job_env)
    assert data["runtime_env"] == {"working_dir": URI, "pip": ["requests"], "env_vars": {"A": "job", "B": "spec"}}
    assert data["workdir"] == "."  # the job's task starts in its own node's copy of the working directory


@pytest.mark.parametrize("workdir, expected", [
    (f"{COPY}/sub/dir", "sub/dir"),  # a workdir inside the uploaded directory: the same place in each copy
    ("/data/elsewhere", "/data/elsewhere"),  # outside it: left as it is
])
def test_a_workdir_is_made_relative_to_the_copy_of_the_working_directory(workdir, expected):
    assert inherit_ray_job_env({"name": "x", "workdir": workdir}, {"working_dir": URI})["workdir"] == expected


def test_outside_a_ray_job_the_spec_is_unchanged():
    spec = {"name": "x", "workdir": "/home/me"}
    assert inherit_ray_job_env(spec, {}) == spec
