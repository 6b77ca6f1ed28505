"""The scheduler's own Ray job: the driver that owns the scheduler's actors, for as long as they live.

    python -m hier_sched.front.control --address GCS --config JSON --state-dir DIR --generation GEN

``hier-sched up`` submits this as a Ray Job named ``hier_sched-<generation>`` (``deploy``). Why a
driver of its own: every task an actor submits belongs to the Ray job of the driver that
created the actor, so the job tasks the node actors launch (one per attempt of a scheduled job)
belong to this job. Were it a driver that exits (``up`` itself, as before), Ray would mark each
of their tasks that had not ended FAILED some seconds later ("Job finishes as driver exits"),
and again for every dead job whenever its dashboard restarts -- a succeeded job would show
FAILED. With this driver alive, a job task ends FINISHED or FAILED as its attempt did
(``node_actor.launcher.run_attempt``), and the Jobs page lists the scheduler by name.

The driver creates the actors (``deploy.attach_scheduler``), prints ``READY``, and then tells
in its log -- the job's log on the dashboard -- what happens to the scheduled jobs: one line
each time a job changes state, with its team queue and the scheduler's reason (where it runs,
why it waits), again for a job still queued when its reason changed after a minute, and one
line each time the team queues are configured anew (``Narrator``). It exits
(0) once the global queue is gone for good, which is what ``down`` does.

It connects to the cluster ``up`` names (``--address``), not to the RAY_ADDRESS Ray's job
supervisor sets: Ray resolves that as "auto", the last head started on the machine, which on
a machine running several Ray clusters may be another one.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

from hier_sched.common.actor_names import GLOBAL_NAME, NAMESPACE

__all__ = ["Narrator", "main"]

_LOOK_S = 5.0  # how often the driver looks at the queue
_REASON_AGAIN_S = 60.0  # a queued job's changed reason is told again after this long


class Narrator:
    """Lines for the control job's log from successive ``GlobalQueue.status()`` answers."""

    def __init__(self) -> None:
        self.told: dict[str, tuple[str, str, float]] = {}  # job -> (state, reason, when told)
        self.queues_told: tuple[Any, ...] | None = None  # the queue configuration last told

    def lines(self, jobs: Iterable[Mapping[str, Any]], now: float) -> list[str]:
        out = []
        for job in jobs:
            job_id, state, reason = job["job_id"], job["state"], job.get("reason") or ""
            told = self.told.get(job_id)
            if told is not None and told[0] == state and (
                    state != "queued" or told[1] == reason or now - told[2] < _REASON_AGAIN_S):
                continue
            self.told[job_id] = (state, reason, now)
            queue = job.get("queue") or "default"
            where = "" if queue == "default" else f" [{queue}]"
            out.append(f"{_clock(now)} {job_id}{where} {state}" + (f": {reason}" if reason else ""))
        return out

    def queue_lines(self, rows: Iterable[Mapping[str, Any]], now: float) -> list[str]:
        """One line when the team queues' configuration changed (``GlobalQueue.queues()`` rows)."""
        rows = list(rows)
        configured = tuple(tuple((k, v) for k, v in row.items() if k in _CONFIGURED) for row in rows)
        if configured == self.queues_told or (self.queues_told is None and not configured):
            self.queues_told = configured
            return []
        self.queues_told = configured
        if not configured:
            return [f"{_clock(now)} team queues removed: every job shares the cluster in one queue"]
        return [f"{_clock(now)} team queues: " + "; ".join(_queue_words(row) for row in rows)]


# What a row of ``hier-sched queues`` says of the configuration (not of the use).
_CONFIGURED = {"name", "cohort", "weight", "nominal_gpus", "nominal_mib", "borrowing_limit_gpus",
               "borrowing_limit_mib", "lending_limit_gpus", "lending_limit_mib"}


def _clock(now: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(now))


def _queue_words(row: Mapping[str, Any]) -> str:
    """``team-a nominal 2 GPUs, borrows up to 2 GPUs``."""
    def amount(field: str) -> str:
        gpus, mib = row[f"{field}_gpus"], row[f"{field}_mib"]
        return " + ".join(([] if gpus is None else [f"{gpus:g} GPUs"]) + ([] if mib is None else [f"{mib / 1024:.1f} GiB"]))

    words = f"{row['name']} nominal {amount('nominal') or '0 GPUs'}"
    limit = amount("borrowing_limit")
    words += f", borrows up to {limit}" if limit else ", borrows any idle"
    if row.get("cohort"):
        words += f", cohort {row['cohort']}"
    if row.get("weight", 1) != 1:
        words += f", weight {row['weight']:g}"
    return words


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hier_sched.front.control", description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="the GCS address of the cluster to attach to")
    parser.add_argument("--config", required=True, help="the ClusterConfig of `up`, as JSON")
    parser.add_argument("--state-dir", required=True, help="the scheduler's state directory on the cluster's nodes")
    parser.add_argument("--generation", required=True, help="the queue generation `up` chose")
    args = parser.parse_args(argv)

    import ray

    from hier_sched.front.deploy import READY, attach_scheduler
    from hier_sched.front.local_cluster import ClusterConfig

    fields = json.loads(args.config)
    config = ClusterConfig(**{**fields, "allowed_roots": tuple(fields.get("allowed_roots", ()))})
    ray.init(address=args.address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
    nodes = attach_scheduler(config, args.state_dir, args.generation)
    print(f"{READY}: queue generation {args.generation}, nodes {', '.join(n.name for n in nodes)}; "
          f"state {args.state_dir}", flush=True)
    narrator = Narrator()
    while (queue := _global_queue()) is not None:
        try:
            now = time.time()
            for line in (narrator.queue_lines(ray.get(queue.queues.remote(), timeout=60), now)
                         + narrator.lines(ray.get(queue.status.remote(), timeout=60), now)):
                print(line, flush=True)
        except Exception as exc:  # noqa: BLE001 - e.g. the queue restarting: told, and looked at again
            print(f"warning: asking the global queue: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        time.sleep(_LOOK_S)
    print("hier_sched scheduler stopped (its global queue is gone): this job ends", flush=True)
    return 0


def _global_queue() -> Any:
    """The queue's handle while its name is held: it is while Ray restarts the actor, and is
    released once the actor was killed for good (``down``); then None."""
    import ray

    while True:
        try:
            return ray.get_actor(GLOBAL_NAME, namespace=NAMESPACE)
        except ValueError:
            return None
        except Exception as exc:  # noqa: BLE001 - e.g. the GCS briefly unreachable: not a reason to let go
            print(f"warning: looking for the global queue: {type(exc).__name__}: {exc}", flush=True)
            time.sleep(_LOOK_S)


if __name__ == "__main__":
    sys.exit(main())
