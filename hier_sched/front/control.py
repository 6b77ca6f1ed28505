"""The scheduler's own Ray job: the driver that owns the scheduler's actors, for as long as they live.

    python -m hier_sched.front.control --config JSON --state-dir DIR --generation GEN

``hier-sched up`` submits this as a Ray Job named ``hier_sched-<generation>`` (``deploy``). Why a
driver of its own: every task an actor submits belongs to the Ray job of the driver that
created the actor, so the job tasks the node actors launch (one per attempt of a scheduled job)
belong to this job. Were it a driver that exits (``up`` itself, as before), Ray would mark each
of their tasks that had not ended FAILED some seconds later ("Job finishes as driver exits"),
and again for every dead job whenever its dashboard restarts -- a succeeded job would show
FAILED. With this driver alive, a job task ends FINISHED or FAILED as its attempt did
(``node_actor.launcher.run_attempt``), and the Jobs page lists the scheduler by name.

The driver creates the actors (``deploy.attach_scheduler``), prints ``READY`` and then only
waits: it exits (0) once the global queue is gone for good, which is what ``down`` does.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from hier_sched.common.actor_names import GLOBAL_NAME, NAMESPACE

__all__ = ["READY", "main"]

READY = "hier_sched scheduler ready"
_LOOK_S = 2.0  # how often the driver looks whether the global queue still exists


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hier_sched.front.control", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the ClusterConfig of `up`, as JSON")
    parser.add_argument("--state-dir", required=True, help="the scheduler's state directory on the cluster's nodes")
    parser.add_argument("--generation", required=True, help="the queue generation `up` chose")
    args = parser.parse_args(argv)

    import ray

    from hier_sched.front.deploy import attach_scheduler
    from hier_sched.front.local_cluster import ClusterConfig

    fields = json.loads(args.config)
    config = ClusterConfig(**{**fields, "allowed_roots": tuple(fields.get("allowed_roots", ()))})
    ray.init(namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)  # the Ray Job's cluster
    nodes = attach_scheduler(config, args.state_dir, args.generation)
    print(f"{READY}: queue generation {args.generation}, nodes {', '.join(n.name for n in nodes)}; "
          f"state {args.state_dir}", flush=True)
    while _global_queue_exists():
        time.sleep(_LOOK_S)
    print("hier_sched scheduler stopped (its global queue is gone): this job ends", flush=True)
    return 0


def _global_queue_exists() -> bool:
    """Whether the queue's name is still held: it is while Ray restarts the actor, and is
    released once the actor was killed for good (``down``)."""
    import ray

    try:
        ray.get_actor(GLOBAL_NAME, namespace=NAMESPACE)
    except ValueError:
        return False
    except Exception as exc:  # noqa: BLE001 - e.g. the GCS briefly unreachable: not a reason to let go
        print(f"warning: looking for the global queue: {type(exc).__name__}: {exc}", flush=True)
    return True


if __name__ == "__main__":
    sys.exit(main())
