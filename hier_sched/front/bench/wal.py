"""How fast the write-ahead log appends and replays (figures in BENCHMARKS.md, "Write-ahead log").

    hier-sched bench wal --records 1000 --records 10000 [--dir DIR] [--json]

Per log size N: appends with one fsync per record (the first ``--fsync-sample`` records, so the
run stays short on slow disks), appends in groups of ``--batch`` (one fsync per group), the time
``WriteAheadLog.open`` takes to replay N records, and the same after ``compact`` folded them
into one snapshot. Replays read a warm page cache (the log was just written), as a restart of
the global queue on the same machine does. The disk matters most: the file system is printed.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import msgpack

from hier_sched.common.wal import WriteAheadLog


def job_event(i: int) -> dict:
    """A job-submitted event of the size the global queue logs (~300 bytes of msgpack)."""
    return {"type": "submitted", "job_id": f"job-{i:06d}", "t": 1_700_000_000.25 + i,
            "spec": {"name": f"resnet50-bs64-{i}", "command": ["python", "train.py", "--batch-size", "64"],
                     "gpus": 1, "gpus_per_node": 1, "memory_mib": 7106, "priority": 0,
                     "slot": {"length_s": 43200, "grace_s": 600},
                     "emulation": {"peak_mib": 7106, "duration_s": 2130, "smact": 0.64}},
            "estimate": {"peak_mib": 7461, "low_mib": 6900, "high_mib": 8100, "method": "trace"}}


def file_system(path: Path) -> str:
    """The type and mount point of the file system holding ``path`` (Linux), for the record."""
    best = ("unknown", "")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mount, kind, *_ = line.split()
            if str(path.resolve()).startswith(mount.rstrip("/") + "/") and len(mount) >= len(best[1]):
                best = (kind, mount)
    except OSError:
        pass
    return f"{best[0]} ({best[1]})" if best[1] else best[0]


def median_s(action, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def reopen(directory: Path) -> None:
    log, _ = WriteAheadLog.open(directory)
    log.close()


def measure(n: int, parent: Path, fsync_sample: int, batch: int, repeats: int) -> dict:
    events = [job_event(i) for i in range(n)]
    one, grouped = parent / f"one-{n}", parent / f"grouped-{n}"

    log, _ = WriteAheadLog.open(one)
    latencies = []
    for event in events[:fsync_sample]:
        start = time.perf_counter()
        log.append(event)
        latencies.append(time.perf_counter() - start)
    log.close()

    log, _ = WriteAheadLog.open(grouped)
    start = time.perf_counter()
    for i in range(0, n, batch):
        log.append_many(events[i:i + batch])
    grouped_s = time.perf_counter() - start
    log.close()
    log_bytes = sum(p.stat().st_size for p in grouped.glob("log-*.wal"))
    replay_s = median_s(lambda: reopen(grouped), repeats)

    log, _ = WriteAheadLog.open(grouped)
    start = time.perf_counter()
    log.compact({e["job_id"]: e for e in events})  # the queue's state: one entry per job
    compact_s = time.perf_counter() - start
    log.close()
    snapshot_replay_s = median_s(lambda: reopen(grouped), repeats)

    latencies.sort()
    return {
        "records": n, "event_bytes": len(msgpack.packb(events[0], use_bin_type=True)), "log_bytes": log_bytes,
        "fsync_each": {"records": len(latencies), "per_s": len(latencies) / sum(latencies),
                       "p50_ms": 1e3 * latencies[len(latencies) // 2],
                       "p99_ms": 1e3 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]},
        "grouped": {"batch": batch, "per_s": n / grouped_s},
        "replay_log_ms": 1e3 * replay_s, "compact_ms": 1e3 * compact_s, "replay_snapshot_ms": 1e3 * snapshot_replay_s,
    }


def bench_wal(sizes: Iterable[int], parent: Path | None, fsync_sample: int, batch: int, repeats: int) -> dict:
    """``measure`` each log size in a scratch directory inside ``parent`` (the system's when None)."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix="wal-bench-") as scratch:
        root = Path(scratch)
        return {"file_system": file_system(root),
                "runs": [measure(n, root, min(fsync_sample, n), batch, repeats) for n in sizes]}
