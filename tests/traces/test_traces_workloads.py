"""The carma workload table: the hand-made join with the AEGIS solo profiles, durations, defaults."""

from __future__ import annotations

import csv
import re
from statistics import fmean

import pytest

from traces._paths import data_file
from traces.workloads import PROFILE_OF, carma_workloads, skipped_workloads, solo_profiles


def _csv(*parts: str) -> list[dict[str, str]]:
    with data_file(*parts).open(newline="") as fh:
        return list(csv.DictReader(fh))


CARMA_ROWS = {r["rad_file"].removesuffix(".rad"): r for r in _csv("workloads", "carma_workloads.csv")}
PROFILE_ROWS = _csv("workloads", "solo_profiles.csv")


def test_every_carma_workload_has_exactly_one_reviewed_mapping():
    assert set(PROFILE_OF) == set(CARMA_ROWS)


@pytest.mark.parametrize("stem", sorted(s for s, (pid, _) in PROFILE_OF.items() if pid))
def test_mapped_profile_is_the_same_run_configuration(stem):
    """Batch size, epochs and measured memory must agree between the two tables."""
    profile_id = PROFILE_OF[stem][0]
    workload = carma_workloads()[stem]
    batch = re.search(r"_bs(\d+)", profile_id)
    if batch:
        assert int(batch.group(1)) == workload.batch_size
    stem_epochs, profile_epochs = re.search(r"_(\d+)e_", stem + "_"), re.search(r"_(\d+)e_", profile_id)
    assert (stem_epochs and stem_epochs.group(1)) == (profile_epochs and profile_epochs.group(1))
    assert solo_profiles()[profile_id].memory_requirement_mib == workload.peak_mib


def test_duration_is_the_recorded_solo_runtime_which_already_counts_epochs():
    # Thesis Table 6.2: xlnet_base 8.949518 min/epoch x 8 epochs; xlnet_large 25.313793 x 3.
    assert carma_workloads()["xlnet_base_cased_2"].duration_s == pytest.approx(8.949518 * 8 * 60, rel=1e-3)
    assert carma_workloads()["xlnet_large_cased_2"].duration_s == pytest.approx(25.313793 * 3 * 60, rel=1e-3)
    for stem, workload in carma_workloads().items():
        minutes = CARMA_ROWS[stem]["sim_solo_runtime_min(exclusive_execution.py)"]
        if minutes:
            assert workload.duration_s == pytest.approx(float(minutes) * 60)


@pytest.mark.parametrize("stem,profile_id", [("UNet", "unet_voc_1gpu"), ("dlrm", "dlrm_criteo_bs32768_1gpu"),
                                             ("maskrcnn", "maskrcnn_coco_bs8_1gpu")])
def test_missing_runtime_falls_back_to_the_profiled_training_loop(stem, profile_id):
    loop = next(float(r["training_loop_time_s"]) for r in PROFILE_ROWS if r["workload_id"] == profile_id)
    assert carma_workloads()[stem].duration_s == loop
    assert "training_loop_time_s" in carma_workloads()[stem].duration_source


def test_multi_gpu_profile_averages_only_the_busy_gpus():
    xlnet = [r for r in PROFILE_ROWS if r["workload_id"] == "xlnet_base_cased_wiki_bs8_2gpu"]
    busy = [float(r["smact_mean_full"]) for r in xlnet if float(r["smact_mean_full"]) > 0]
    assert len(xlnet) == 2 and len(busy) == 1
    assert carma_workloads()["xlnet_base_cased_2"].util.smact == pytest.approx(busy[0])
    gpt2 = [float(r["smact_mean_full"]) for r in PROFILE_ROWS if r["workload_id"] == "gpt2_large_wiki_bs8_2gpu"]
    assert carma_workloads()["gpt2_large_2"].util.smact == pytest.approx(fmean(gpt2))


def test_unprofiled_transformers_get_the_mean_transformer_profile():
    profiled = [carma_workloads()[s].util.smact for s in ("xlnet_base_cased_2", "gpt2_large_2")]
    for stem in ("BERT_base", "BERT_large", "xlnet_large_cased_2"):
        util = carma_workloads()[stem].util
        assert util.smact == pytest.approx(fmean(profiled))
        assert "mean of the transformer profiles" in util.source


def test_failed_estimates_are_kept_as_recorded_and_incomplete_rows_are_skipped():
    assert carma_workloads()["dlrm"].horus_mib == 40000.0
    assert carma_workloads()["maskrcnn"].batch_size == 8  # its command line says -b 8
    assert "gpt2_xl" not in carma_workloads()
    assert any(s.startswith("gpt2_xl") for s in skipped_workloads())
