"""``carma:<trace>``: the thesis traces joined with their workloads."""

from __future__ import annotations

import csv

import pytest

from traces import TraceError, load_trace
from traces._paths import data_file
from traces.carma import CARMA_TRACES
from traces.validate import job_problems


def _rows(trace: str) -> list[dict[str, str]]:
    with data_file("traces", "carma", "traces.csv").open(newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["trace"] == f"{trace}.sh"]


@pytest.mark.parametrize("trace", CARMA_TRACES)
def test_every_job_is_joined_completely(trace):
    rows = _rows(trace)
    loaded = load_trace(f"carma:{trace}")
    assert len(loaded.jobs) == len(rows) > 0
    for job, row in zip(loaded.jobs, rows, strict=True):
        assert job.workload == row["rad_file"].removesuffix(".rad")
        assert job.submit_s == float(row["submit_time_s"])
        assert job.gpus == int(row["num_gpus"])
        assert job.peak_mib == float(row["oracle_peak_mem_mib"])
        assert job.horus_mib == float(row["horus_est_mib"])
        assert job.faketensor_mib == float(row["faketensor_est_mib"])
        assert job.gpumemnet_mib == float(row["gpumemnet_est_mib"])
        assert job.duration_s > 0 and 0 < job.smact <= 1 and job.batch_size and job.model_kind
        assert job_problems(job) == []
    assert len({j.job_id for j in loaded.jobs}) == len(rows)


def test_thesis_trace_sizes_and_server():
    sizes = {t: len(load_trace(f"carma:{t}").jobs) for t in CARMA_TRACES}
    assert sizes == {"philly_heavy-60-tasks": 60, "philly_mix-90-tasks": 90, "philly_trace-t1": 60,
                     "philly_trace-t2": 60, "test": 5}
    cluster = load_trace("carma:philly_mix-90-tasks").cluster
    assert (cluster.nodes, cluster.gpus_per_node, cluster.gpu_type) == (1, 4, "A100-40GB")


def test_failed_estimates_stay_40000():
    failed = sum(r["faketensor_est_mib"] == "40000" for r in _rows("philly_mix-90-tasks"))
    assert failed > 0
    assert sum(j.faketensor_mib == 40000 for j in load_trace("carma:philly_mix-90-tasks").jobs) == failed


def test_loads_are_independent_copies():
    first = load_trace("carma:test")
    first.jobs.clear()
    assert len(load_trace("carma:test").jobs) == 5


def test_unknown_carma_trace_lists_the_known_ones():
    with pytest.raises(TraceError, match="philly_mix-90-tasks"):
        load_trace("carma:philly_scenario_old")


def test_notes_name_the_jobs_that_rest_on_fallbacks():
    notes = " | ".join(load_trace("carma:philly_trace-t1").notes)
    assert "kind mean used: BERT_base" in notes
    assert "training-loop time used: UNet, dlrm, maskrcnn" in notes
    assert "training-loop" not in " | ".join(load_trace("carma:test").notes)
