"""``carma:<trace>``: the thesis' traces (``traces/carma/traces.csv``) on its 4 x A100-40GB server.

Per job the trace file gives submit time, workload (rad file), #GPUs, the measured peak memory
and the three recorded estimates; the workload table (``traces.workloads``) adds the solo
duration, batch size, model kind and utilization profile. ``philly_scenario_old`` is not offered:
it names workloads (densenet, gpt2_large on one GPU, ...) that have no measured peak.
"""

from __future__ import annotations

from traces._csv import read_rows
from traces._paths import cached_per_data_dir, data_file
from traces.schema import ClusterHint, Trace, TraceError, TraceJob
from traces.workloads import carma_workloads

__all__ = ["CARMA_TRACES", "load_carma"]

CARMA_TRACES = ("philly_heavy-60-tasks", "philly_mix-90-tasks", "philly_trace-t1", "philly_trace-t2", "test")
THESIS_SERVER = ClusterHint(nodes=1, gpus_per_node=4, gpu_type="A100-40GB")  # DGX Station A100

_COLUMNS = ("trace", "job_index", "submit_time_s", "rad_file", "num_gpus", "oracle_peak_mem_mib",
            "horus_est_mib", "faketensor_est_mib", "gpumemnet_est_mib")


@cached_per_data_dir
def _jobs_of(trace: str) -> tuple[TraceJob, ...]:
    path = data_file("traces", "carma", "traces.csv")
    workloads = carma_workloads()
    jobs = []
    for row in read_rows(path, _COLUMNS):
        if row.text("trace").removesuffix(".sh") != trace:
            continue
        stem = row.text("rad_file").removesuffix(".rad")
        workload = workloads.get(stem)
        if workload is None:
            raise row.error(f"workload {stem!r} is not in carma_workloads.csv (or has no measured peak)")
        gpus = row.integer("num_gpus")
        jobs.append(TraceJob(
            job_id=f"{trace}-{row.integer('job_index')}",
            submit_s=row.number("submit_time_s"),
            workload=stem,
            gpus=gpus,
            duration_s=workload.duration_s,
            peak_mib=row.number("oracle_peak_mem_mib"),
            smact=workload.util.smact,
            smocc=workload.util.smocc,
            drama=workload.util.drama,
            batch_size=workload.batch_size,
            model_kind=workload.model_kind,
            horus_mib=row.optional_number("horus_est_mib"),
            faketensor_mib=row.optional_number("faketensor_est_mib"),
            gpumemnet_mib=row.optional_number("gpumemnet_est_mib"),
        ))
    return tuple(jobs)


def _notes(jobs: tuple[TraceJob, ...]) -> list[str]:
    """Which jobs rest on a fallback rather than a measurement of their own."""
    workloads = carma_workloads()
    used = sorted({j.workload for j in jobs})
    borrowed = [w for w in used if not workloads[w].util.source.startswith("solo_profiles.csv")]
    loop_times = [w for w in used if "training_loop_time_s" in workloads[w].duration_source]
    notes = ["durations: solo runtime of the workload (epoch time x epochs, thesis Table 6.2)"]
    if borrowed:
        notes.append(f"no solo profile, kind mean used: {', '.join(borrowed)}")
    if loop_times:
        notes.append(f"no thesis runtime, AEGIS training-loop time used: {', '.join(loop_times)}")
    return notes


def load_carma(trace: str) -> Trace:
    if trace not in CARMA_TRACES:
        raise TraceError(f"unknown carma trace {trace!r}; known: {', '.join(CARMA_TRACES)}")
    jobs = _jobs_of(trace)
    return Trace(
        name=f"carma:{trace}",
        jobs=list(jobs),
        cluster=THESIS_SERVER,
        source=str(data_file("traces", "carma", "traces.csv")),
        notes=_notes(jobs),
    )
