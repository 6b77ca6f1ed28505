"""``openb:default`` / ``openb:gpushare100``: Alibaba's openb GPU cluster trace (2023).

Read from ``traces/alibaba-openb-2023/`` (column notes in its ``SCHEMA.md``). What we derive:

* Jobs are the pods that ask for a GPU; pods with ``num_gpu == 0`` are skipped and counted in
  ``Trace.notes``. Fractional pods (``gpu_milli < 1000``) take one GPU; ``TraceJob.gpu_milli``
  keeps the requested share.
* ``submit_s`` = ``creation_time``. ``duration_s`` = ``deletion_time`` - ``scheduled_time`` (the
  time it ran); pods never scheduled (``Pending``) keep their whole lifetime
  ``deletion_time`` - ``creation_time``, the time they would have held the GPU had they started.
  Lifetimes below 1 s are raised to 1 s (counted in the notes) so every job takes simulated time.
  The trace does not say which GPU a pod ran on, so durations are wall-clock, not A100-normalised.
* Memory: the trace has none. A pod's peak is ``gpu_milli`` / 1000 x the memory of the *smallest*
  GPU in the cluster (T4, 15,360 MiB): ``gpu_spec`` is empty for every pod (any GPU type), and
  this is the only reading under which every pod fits every node it may land on.
* Utilization: the trace has none either. A pod's SMACT / SMOCC / DRAMA are its share
  (``gpu_milli`` / 1000) of the median solo profile of the thesis workloads.
* ``qos`` becomes ``priority``: LS / Guaranteed 2, Burstable 1, BE 0.
* Cluster hint: the 1,213 GPU nodes with their GPU model (the 310 CPU-only nodes of the full
  1,523-node trace are not in the file). G1/G2/G3 are undisclosed models; they are replayed as
  A100-40GB (8-GPU nodes of a 2023 training cluster), a stated assumption, not a fact.
"""

from __future__ import annotations

from collections import Counter
from statistics import median

from hier_sched.core.gpu_types import gpu_type
from traces._csv import read_rows
from traces._paths import cached_per_data_dir, data_file
from traces.schema import ClusterHint, Trace, TraceError, TraceJob
from traces.workloads import solo_profiles

__all__ = ["OPENB_TRACES", "OPENB_GPU_MODELS", "load_openb"]

OPENB_TRACES = ("default", "gpushare100")
OPENB_GPU_MODELS = {
    "V100M16": "V100-16GB",
    "V100M32": "V100-32GB",
    "P100": "P100",
    "T4": "T4",
    "A10": "A10",
    "G1": "A100-40GB",  # undisclosed
    "G2": "A100-40GB",  # undisclosed
    "G3": "A100-40GB",  # undisclosed
}
QOS_PRIORITY = {"LS": 2, "Guaranteed": 2, "Burstable": 1, "BE": 0}
MIN_DURATION_S = 1.0
_DIR = ("traces", "alibaba-openb-2023")
_NODE_FILE = "openb_node_list_gpu_node.csv"
_POD_COLUMNS = ("name", "num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time", "scheduled_time")


@cached_per_data_dir
def _cluster() -> ClusterHint:
    nodes = []
    for row in read_rows(data_file(*_DIR, _NODE_FILE), ("sn", "gpu", "model")):
        model = row.text("model")
        if model not in OPENB_GPU_MODELS:
            raise row.error(f"unknown GPU model {model!r}; known: {', '.join(OPENB_GPU_MODELS)}")
        nodes.append((row.integer("gpu"), OPENB_GPU_MODELS[model]))
    gpus_by_type: Counter[str] = Counter()
    for gpus, name in nodes:
        gpus_by_type[name] += gpus
    return ClusterHint(
        nodes=len(nodes),
        gpus_per_node=max(g for g, _ in nodes),
        gpu_type=gpus_by_type.most_common(1)[0][0],
        node_list=tuple(nodes),
    )


def _full_gpu_profile() -> tuple[float, float, float]:
    """Median solo SMACT / SMOCC / DRAMA of the thesis workloads: a pod holding a whole GPU."""
    utils = [p.util for p in solo_profiles().values()]
    return median(u.smact for u in utils), median(u.smocc for u in utils), median(u.drama for u in utils)


@cached_per_data_dir
def _jobs_of(variant: str) -> tuple[tuple[TraceJob, ...], tuple[str, ...]]:
    path = data_file(*_DIR, f"openb_pod_list_{variant}.csv")
    reference_mib = min(gpu_type(name).memory_mib for _, name in _cluster().node_list)
    smact, smocc, drama = _full_gpu_profile()
    jobs = []
    cpu_only = raised = 0
    for row in read_rows(path, _POD_COLUMNS):
        num_gpu, milli = row.integer("num_gpu"), row.integer("gpu_milli")
        if num_gpu == 0:
            cpu_only += 1
            continue
        if num_gpu < 0 or not 0 < milli <= 1000 or (num_gpu > 1 and milli != 1000):
            raise row.error(f"num_gpu {num_gpu} with gpu_milli {milli}: expected 1-1000 milli, 1000 when num_gpu > 1")
        qos = row.text("qos")
        if qos not in QOS_PRIORITY:
            raise row.error(f"unknown qos {qos!r}; known: {', '.join(QOS_PRIORITY)}")
        created = row.number("creation_time")
        started = row.optional_number("scheduled_time")
        lifetime = row.number("deletion_time") - (created if started is None else started)
        if lifetime < MIN_DURATION_S:
            raised += 1
        share = milli / 1000
        jobs.append(TraceJob(
            job_id=row.text("name"),
            submit_s=created,
            workload=f"openb-{qos}",
            gpus=num_gpu,
            duration_s=max(lifetime, MIN_DURATION_S),
            peak_mib=share * reference_mib,
            smact=share * smact,
            smocc=share * smocc,
            drama=share * drama,
            gpu_milli=milli,
            priority=QOS_PRIORITY[qos],
        ))
    jobs.sort(key=lambda j: j.submit_s)  # the gpushare100 file is not in creation order
    notes = (
        f"skipped {cpu_only} pods without GPUs (num_gpu == 0)",
        f"{raised} pods lived < {MIN_DURATION_S:g} s; their duration was raised to {MIN_DURATION_S:g} s",
        f"peak_mib = gpu_milli / 1000 x {reference_mib} MiB (the smallest GPU of the cluster)",
        "GPU models G1/G2/G3 are undisclosed; replayed as A100-40GB",
        "durations are wall-clock on whatever GPU a pod ran on (not A100-normalised)",
    )
    return tuple(jobs), notes


def load_openb(variant: str) -> Trace:
    if variant not in OPENB_TRACES:
        raise TraceError(f"unknown openb trace {variant!r}; known: {', '.join(OPENB_TRACES)}")
    jobs, notes = _jobs_of(variant)
    return Trace(
        name=f"openb:{variant}",
        jobs=list(jobs),
        cluster=_cluster(),
        source=str(data_file(*_DIR, f"openb_pod_list_{variant}.csv")),
        notes=list(notes),
        duration_gpu=None,  # pod lifetimes are wall-clock times on the pod's own GPU
    )
