"""The global queue's own figures: restart to ready by the size of its log, and submit to launch.

    hier-sched bench queue restart --jobs 1000 --jobs 10000 [--json]
    hier-sched bench queue latency --jobs 20 [--json]      (on a running cluster: `hier-sched up`)
    hier-sched bench queue memory --jobs 10000 [--json]

``restart``:
Writes a real write-ahead log (fsync'd, as the GlobalQueue writes it) holding N jobs' lives —
submitted, started, ended (three in four succeeded, the rest still queued or running) — then
times what a restarted GlobalQueue does before it answers: open the log, replay every record
through the core's ``Scheduler``, re-issue what is owed. Ray's own actor restart (a new worker
process, about a second) comes on top. Nodes are in-process stand-ins: reconciliation with real
node actors happens on the first tick after ready.

``latency``: submits jobs one after another through the Python client (one Ray connection, as
``hier_sched.submit`` does) to an idle cluster and reads, from each job's history, how long the
queue took from accepting it to the node's acceptance of its launch order (the queue's tick is
0.2 s, so about half of that is waiting for the next tick).

``memory``: submits N jobs through ``QueueService.submit`` (spec check, estimate, journal with
its fsync, the core's queue) to a queue whose nodes launch nothing, so all N stay queued; prints
the process' resident memory before and after (the difference is the queue's state), then
the restart to ready from that log and the memory of the restarted queue.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from global_queue.journal import Journal
from global_queue.service import CallsOneAtATime, QueueService
from hier_sched.core.events import JobTicket, NodeJoined, RunEnded, RunStarted, Submitted
from hier_sched.core.gpu import Placement

_GPU_MIB = 40536.0
# a ResNet-50 training job as a user would submit it (the thesis' estimate for batch 64)
_TRAINING_SPEC = {"name": "bench", "command": ["python", "train.py", "--epochs", "90"], "gpus": 1,
                  "memory_mib": 7106.0, "estimator": "none"}


class _Nodes(CallsOneAtATime):
    """Nodes that answer nothing but their GPU sizes (what start-up asks of them)."""

    def __init__(self, count: int, gpus: int):
        super().__init__()
        self.names = [f"node{i}" for i in range(count)]
        self.gpus = gpus

    def reports(self, acks):
        return {}

    def call(self, node, method, *args):
        if method == "gpu_totals":
            return [_GPU_MIB] * self.gpus
        if method == "gpu_types":
            return ["A100-40GB"] * self.gpus
        raise RuntimeError("not reachable in this benchmark")


def write_log(directory: Path, jobs: int, nodes: int = 8, gpus: int = 8) -> int:
    """A log of ``jobs`` jobs' lives; returns the number of records."""
    journal, _, _ = Journal.open(directory)
    journal.append([NodeJoined(f"node{i}", (_GPU_MIB,) * gpus) for i in range(nodes)], 0.0)
    spec = {**_TRAINING_SPEC, "priority": 0, "env": {}, "max_attempts": 4}
    batch = []
    for i in range(jobs):
        job_id = f"job-{i:06d}"
        node, gpu = f"node{i % nodes}", i % gpus
        batch.append((Submitted(JobTicket(job_id, "bench", need_mib=7106.0, signature=f"w{i % 50}")), {"spec": spec}))
        if i % 8 != 7:  # most have started ...
            batch.append((RunStarted(job_id, 1, (Placement(job_id, node, (gpu,), 7106.0),)), {}))
            if i % 4 != 3:  # ... and most of those have ended
                batch.append((RunEnded(job_id, 1, None, 0, 7000.0, node), {}))
        if len(batch) >= 512:
            journal.append([e for e, _ in batch], float(i), [x for _, x in batch])
            batch = []
    journal.append([e for e, _ in batch], float(jobs), [x for _, x in batch])
    count = len(journal.records)
    journal.close()
    return count


def time_restart(directory: Path, repeat: int) -> list[float]:
    seconds = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        service = QueueService(_Nodes(8, 8), state_dir=directory, clock=lambda: 1e6)
        seconds.append(time.perf_counter() - t0)
        service.journal.close()
    return seconds


def submit_to_launch(jobs: int) -> dict:
    """Seconds from the queue accepting a submission to its run starting, per job (idle cluster)."""
    from hier_sched.front.connection import connect

    scheduler = connect()
    seconds = []
    for i in range(jobs):
        spec = {"name": f"latency-{i}", "command": ["true"], "memory_mib": 1000, "estimator": "none",
                "emulation": {"peak_mib": 1000, "duration_s": 1.0, "warmup_s": 0}}
        job_id = scheduler.submit(spec)["job_id"]
        deadline = time.time() + 60
        while time.time() < deadline:
            history = scheduler.call("history", job_id) or []
            started = [t for t, _, to, _ in history if to == "running"]
            if started:
                seconds.append(started[0] - scheduler.call("status", job_id)["submit_time"])
                break
            time.sleep(0.05)
        time.sleep(0.5)  # the next job meets an idle cluster again (GPUs out of their launch grace)
    return {"jobs": len(seconds), "p50_s": round(statistics.median(seconds), 3),
            "p90_s": round(sorted(seconds)[int(0.9 * (len(seconds) - 1))], 3), "max_s": round(max(seconds), 3)}


def queued_memory(jobs: int) -> dict:
    """Resident memory of a queue holding ``jobs`` queued jobs, and its restart from their log."""
    import gc

    import psutil

    process = psutil.Process()
    spec = {**_TRAINING_SPEC, "workdir": tempfile.gettempdir()}
    with tempfile.TemporaryDirectory() as tmp:
        gc.collect()
        before = process.memory_info().rss
        service = QueueService(_Nodes(8, 8), state_dir=Path(tmp), clock=lambda: 1e6)
        t0 = time.perf_counter()
        for _ in range(jobs):
            service.submit(spec)
        submit_s = time.perf_counter() - t0
        gc.collect()
        queued = process.memory_info().rss
        service.journal.close()
        del service
        gc.collect()
        after_close = process.memory_info().rss
        t0 = time.perf_counter()
        restarted = QueueService(_Nodes(8, 8), state_dir=Path(tmp), clock=lambda: 1e6)
        restart_s = time.perf_counter() - t0
        gc.collect()
        waiting = len(restarted.scheduler.unfinished())
        reloaded = process.memory_info().rss
        restarted.journal.close()
    mib = 1024 * 1024
    return {"jobs": jobs, "queued_after_restart": waiting, "process_before_mib": round(before / mib, 1),
            "queue_state_mib": round((queued - before) / mib, 1),
            "per_job_kib": round((queued - before) / jobs / 1024, 2), "submit_per_job_ms": round(submit_s / jobs * 1e3, 3),
            "restart_to_ready_s": round(restart_s, 3),
            "restarted_state_mib": round((reloaded - after_close) / mib, 1)}


def restart_to_ready(sizes: Iterable[int], repeat: int) -> list[dict]:
    """Per log size: the restart to ready, ``repeat`` times, from a log of that many jobs' lives."""
    rows = []
    for jobs in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            state = Path(tmp)
            records = write_log(state / "queue" / "current", jobs)
            seconds = time_restart(state, repeat)
        rows.append({"jobs": jobs, "records": records, "restart_to_ready_s_median": round(statistics.median(seconds), 3),
                     "min_s": round(min(seconds), 3), "max_s": round(max(seconds), 3), "repeat": repeat})
    return rows
