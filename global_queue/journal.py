"""The GlobalQueue's journal: the core's events in the write-ahead log, and how the log is compacted.

A record is ``{"t": scheduler clock, "e": the event (``events.to_record``)}`` plus what the core
does not keep but a restart needs: a submission's validated ``spec`` as submitted, the ``launch``
spec its launches carry (``messages.LaunchSpec``, taken from the spec once, at submission) and
its callable's ``payload``; a run's pickled ``result``. Replaying the records through the core
rebuilds the queue.

Record versions: version 2 added ``launch``. A version 1 submission (a log written before) has
only ``spec``: reading the log takes its launch spec from that spec, so the records replayed and
the next compaction's snapshot are all of version 2.

Compaction keeps the log from growing without end: every ``compact_every`` records the journal
writes a snapshot holding the records still needed — every record of the jobs still alive or
among the ``keep_finished`` most recently ended (older finished jobs leave ``status``, as Slurm
forgets jobs past ``MinJobAge``), the team queues, and the nodes' records but those of nodes gone
for good (``_gone_nodes``: on an autoscaled or spot cluster a node comes once and leaves, and
its records would otherwise pile up with the churn) — and the log starts afresh.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hier_sched.common.messages import LaunchSpec
from hier_sched.common.plain_data import from_plain, to_plain
from hier_sched.common.wal import WriteAheadLog
from hier_sched.core.events import Event, event_from_record, to_record
from hier_sched.core.spec import JobSpec

__all__ = ["Journal", "JOURNAL_VERSION"]

log = logging.getLogger(__name__)

JOURNAL_VERSION = 2  # of the record layout inside the log (the log file has its own format version)


class Journal:
    def __init__(self, wal: WriteAheadLog, records: list[dict[str, Any]], *, compact_every: int, keep_finished: int):
        self.wal = wal
        self.records = records  # everything a replay needs, in order (kept for compaction)
        self.compact_every = compact_every
        self.keep_finished = keep_finished
        self._since_compaction = 0
        self._writer: threading.Thread | None = None  # a compaction's write, in the background
        # Appends (under ``QueueService.intake_lock``) go on while the tick compacts (under the
        # state's lock): a record is in the log and in ``records`` together, and a compaction
        # sees both or neither.
        self._lock = threading.Lock()

    @classmethod
    def open(cls, directory: str | Path, *, compact_every: int = 20_000, keep_finished: int = 10_000,
             fsync: bool = True) -> tuple["Journal", list[dict[str, Any]], str | None]:
        """(journal, records to replay in order, what damage was found and cut off, if any)."""
        wal, recovered = WriteAheadLog.open(directory, fsync=fsync)
        snapshot = recovered.snapshot.value if recovered.snapshot else {"version": JOURNAL_VERSION, "records": []}
        if snapshot.get("version", 0) > JOURNAL_VERSION:
            wal.close()
            raise ValueError(f"{directory}: the queue's journal was written by a newer hier_sched "
                             f"(journal version {snapshot['version']}, this one reads {JOURNAL_VERSION})")
        records = [_upgraded(r) for r in [*snapshot["records"], *recovered.records]]
        damage = str(recovered.damage) if recovered.damage else None
        return cls(wal, list(records), compact_every=compact_every, keep_finished=keep_finished), records, damage

    @staticmethod
    def event(record: dict[str, Any]) -> Event:
        return event_from_record(record["e"])

    @staticmethod
    def submission(spec: JobSpec, payload: bytes | None, request_id: str | None) -> dict[str, Any]:
        """What a submission's record keeps besides its event (``append``'s extras)."""
        return {"spec": spec.model_dump(mode="json"), "launch": to_plain(LaunchSpec.of(spec), LaunchSpec),
                "payload": payload, "request_id": request_id}

    @staticmethod
    def launch_spec(record: dict[str, Any]) -> LaunchSpec:
        """A submission record's launch spec."""
        return from_plain(record["launch"], LaunchSpec)

    def append(self, events: Sequence[Event], now_s: float, extras: Sequence[dict[str, Any]] | None = None,
               *, sync: bool = True) -> list[dict[str, Any]]:
        """Log ``events`` (durable when this returns, unless not ``sync``: ``WriteAheadLog.append_many``)
        and return their records."""
        records = []
        for i, event in enumerate(events):
            record = {"t": now_s, "e": to_record(event)}
            if extras and extras[i]:
                record.update({k: v for k, v in extras[i].items() if v is not None})
            records.append(record)
        if records:
            with self._lock:
                self.wal.append_many(records, sync=sync)
                self.records.extend(records)
                self._since_compaction += len(records)
        return records

    def due(self) -> bool:
        return self._since_compaction >= self.compact_every and not self.compacting()

    def compacting(self) -> bool:
        return self._writer is not None and self._writer.is_alive()

    def compact(self, finished_order: Callable[[], list[str]], *, in_background: bool = False) -> int:
        """Snapshot what is still needed; ``finished_order()`` lists ended jobs, oldest first.
        Returns how many records were dropped. The records are chosen now (under the caller's
        lock); ``in_background`` writes them on a thread of their own while appends go on: at a
        hundred thousand jobs the write took seconds, and the queue's lock with it."""
        forget = set(finished_order()[: -self.keep_finished or None]) if self.keep_finished else set(finished_order())
        with self._lock:  # no append between choosing the records and the point the snapshot covers
            kept = [r for r in self.records if _job_of(r) not in forget]
            gone = _gone_nodes(kept)
            kept = [r for r in kept if r["e"].get("node") not in gone or _job_of(r) is not None]
            covered = self.wal.begin_compaction()
            dropped = len(self.records) - len(kept)
            self.records = kept
            self._since_compaction = 0
        snapshot = {"version": JOURNAL_VERSION, "records": list(kept)}
        if not in_background:
            self.wal.finish_compaction(covered, snapshot)
            return dropped
        self._writer = threading.Thread(target=self._finish, args=(covered, snapshot), name="journal-compaction",
                                        daemon=True)
        self._writer.start()
        return dropped

    def _finish(self, covered: int, snapshot: dict[str, Any]) -> None:
        try:
            self.wal.finish_compaction(covered, snapshot)
        except Exception:  # noqa: BLE001 - the log refuses appends from now on, which the queue reports
            log.exception("compacting the queue's journal failed")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.join()
        self.wal.close()


def _upgraded(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` in this version's layout: a version 1 submission gains the launch spec of its spec."""
    if record["e"]["type"] != "Submitted" or "launch" in record:
        return record
    launch = LaunchSpec.of(JobSpec.model_validate(record["spec"]))
    return {**record, "launch": to_plain(launch, LaunchSpec)}


_MEMBERSHIP = ("NodeJoined", "NodeLost")
_DRAINS = {"NodeDraining": True, "NodeUndrained": False}


def _gone_nodes(records: Sequence[dict[str, Any]]) -> set[str]:
    """The nodes whose records a snapshot may drop: lost at their last word (a joined-then-lost node
    rebuilds to the same as no node at all), no drain waiting for their return, and named by no
    job record kept (a run there must still be requeued by the loss on replay)."""
    last: dict[str, str] = {}
    drained: dict[str, bool] = {}
    named: set[str] = set()
    for record in records:
        e = record["e"]
        kind = e["type"]
        if kind in _MEMBERSHIP:
            last[e["node"]] = kind
        elif kind in _DRAINS:
            drained[e["node"]] = _DRAINS[kind]
        else:
            named.update(_nodes_named(e))
    return {n for n, kind in last.items() if kind == "NodeLost" and not drained.get(n) and n not in named}


def _nodes_named(e: dict[str, Any]) -> set[str]:
    """The nodes a job's event names: a rank's node, a run's placements, a gang's started ranks."""
    nodes = {p["node"] for p in e.get("placements", ())} | set(e.get("started", ()))
    if e.get("node") is not None:
        nodes.add(e["node"])
    return nodes


def _job_of(record: dict[str, Any]) -> str | None:
    e = record["e"]
    return e["ticket"]["job_id"] if e["type"] == "Submitted" else e.get("job_id")
