"""The Ray task each attempt of a job runs in (``RayLauncher.launch``).

A module of its own that imports only the launcher: every Ray worker that runs a job imports the
task's module before it starts, and ``node_actor.actor`` with all it imports cost each such worker
~0.6 s more (BENCHMARKS.md, "Dispatch against plain Ray"): a busy node starts one worker per job
it runs at once.
"""

from __future__ import annotations

import ray

from node_actor.launcher import LaunchRequest, run_attempt

__all__ = ["run_job_task"]


@ray.remote(num_cpus=0, num_gpus=0, max_retries=0)
def run_job_task(request: LaunchRequest) -> str:
    return run_attempt(request)
