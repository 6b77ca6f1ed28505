"""The launch ledger: runs the scheduler launched that the nodes' snapshots do not show yet.

Snapshots arrive late: a node reports a launch some time after the scheduler ordered it. Until a
node's snapshots show a run, the scheduler counts the run there itself: its reservation is
taken on its GPUs, which are in their post-launch grace, for every plan (Kubernetes' "assume") —
so no GPU is ever planned beyond its capacity on a snapshot older than the scheduler's own orders.
"""

from __future__ import annotations

from hier_sched.core.cluster_view import ClusterIndex
from hier_sched.core.managed_job import ManagedJob

__all__ = ["LaunchLedger"]


class LaunchLedger:
    """Job id -> the job whose run (launched, or adopted after a restart) no snapshot has shown yet."""

    def __init__(self) -> None:
        self.unshown: dict[str, ManagedJob] = {}

    def launched(self, job: ManagedJob) -> None:
        self.unshown[job.ticket.job_id] = job

    def run_ended(self, job_id: str) -> None:
        """The run ended or was declined: nothing of it is left to count."""
        self.unshown.pop(job_id, None)

    def count_unshown_runs(self, cluster: ClusterIndex) -> None:
        """Place on ``cluster`` the runs its snapshots do not show yet (``ClusterIndex.assume``); a
        run they show on every node is shown, and leaves the ledger, and a run that ended (or a
        gang's rank that did) is counted no more. A node missing from the snapshots shows nothing."""
        cluster.forget_assumed({(job_id, job.record.attempts) for job_id, job in self.unshown.items()})
        for job_id, job in list(self.unshown.items()):
            shown = True
            for p in job.live_ranks():
                if p.node not in cluster.pos:
                    shown = False
                elif not cluster.shows(p, job.record.attempts):
                    shown = False
                    cluster.assume(p, job.record.attempts, job.run_started_s)  # type: ignore[arg-type]
            if shown:
                del self.unshown[job_id]
