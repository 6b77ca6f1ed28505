"""estimate_for_workload (the replay's estimator), the evaluation command and the CLI."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from estimators import estimate_for_workload
from estimators.data import shared_dir
from estimators.trace_estimator import AUTO_MARGIN
from estimators.workloads import canonical_workload
from hier_sched.front.cli import main


@pytest.mark.parametrize("name,family,batch", [
    ("resnet3.rad", "resnet", 128),
    ("Inception2", "inception", 64),
    ("resnet18_cifar100_50e_3", "resnet18_cifar100", 128),
    ("xlnet_large_cased_2", "xlnet_large_cased", None),
    ("ResNet-50 (batch size 64)", "resnet50", 64),
])
def test_workload_names(name, family, batch):
    w = canonical_workload(name)
    assert (w.family, w.batch) == (family, batch)


def test_traced_workloads_grow_with_batch_and_are_cached():
    a = estimate_for_workload("resnet", 32, {})
    b = estimate_for_workload("resnet2", 64, {})
    c = estimate_for_workload("resnet3", 128, {})
    assert a.peak_mib < b.peak_mib < c.peak_mib
    assert a.method.startswith("ours:trace-table(resnet50")
    assert estimate_for_workload("resnet", 32, {}) is a  # cached per (workload, batch)
    between = estimate_for_workload("resnet", 48, {})
    assert a.peak_mib < between.peak_mib < b.peak_mib


def test_untraceable_workloads_use_faketensor_transfer_or_the_whole_gpu():
    ft = estimate_for_workload("UNet", 32, {"horus": 2231.06, "faketensor": 3404.085, "gpumemnet": 8000.0})
    assert ft.method == "ours:faketensor-transfer" and ft.peak_mib > 3404.085
    assert estimate_for_workload("Xception2", 64, {"faketensor": 8324.9}).method.startswith("ours:trace-table(xception")
    failed = estimate_for_workload("dlrm", 32768, {"horus": 40000.0, "faketensor": 40000.0, "gpumemnet": 40000.0})
    assert failed.method.startswith("ours:whole-gpu") and failed.peak_mib == 40536


def test_mask_rcnn_uses_the_batch_of_its_command_not_the_csv():
    """carma_workloads.csv lists batch 128; the command runs the detection reference with ``-b 8``."""
    est = estimate_for_workload("maskrcnn", 128, {"faketensor_mib": None})
    assert est.method == "ours:trace-table(maskrcnn_resnet50_fpn, batch 8)"
    assert est == estimate_for_workload("maskrcnn", 8, {})


def test_ours_never_reads_the_oracle():
    """The same workload with a different recorded truth must give the same estimate."""
    rows = list(csv.DictReader((shared_dir() / "data" / "workloads" / "carma_workloads.csv").open()))
    row = next(r for r in rows if r["rad_file"] == "vgg2.rad")
    rec = {"horus": float(row["horus_est_mib"]), "faketensor": float(row["faketensor_est_mib"])}
    assert estimate_for_workload("vgg2", 64, dict(rec, oracle=1.0)) == estimate_for_workload("vgg2", 64, rec)


def test_other_gpu_types_shift_by_the_context():
    a100 = estimate_for_workload("vgg", 32, {})
    t4 = estimate_for_workload("vgg", 32, {}, gpu="T4")
    assert t4.peak_mib < a100.peak_mib


@pytest.mark.slow
def test_evaluate_and_table_commands(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["estimators", "evaluate", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    scores = {(s["data"], s["estimator"]): s for s in report["memory"]}
    assert all(u["mae"] < u["mae_predict_mean"] for u in report["utilization"])
    ours = scores[("gpumemnet-mlp held-out", "ours ml (point)")]
    assert ours["bucket_acc"] >= 0.985 and ours["median_abs_err"] <= 0.05
    horus = scores[("gpumemnet-mlp held-out", "horus")]
    assert horus["median_abs_err"] > ours["median_abs_err"]
    real = scores[("real workloads", "ours auto (all)")]
    assert real["rows"] >= 40
    assert real["median_abs_err"] <= 0.10 and real["far_under_rate"] <= 0.05  # the real-model target

    bad = tmp_path / "bad.csv"
    bad.write_text("Depth,Batch Size\n3,12\n")
    out = runner.invoke(main, ["estimate-table", "--kind", "mlp", "--input", str(bad), "--output", str(tmp_path / "o.csv")])
    assert out.exit_code != 0 and "Activations-Params" in out.output


def test_estimate_command_with_a_spec(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: t\ncommand: [python, train.py]\nmodel:\n  factory: estimators.zoo.vision:mnist_cnn\n"
                    "  batch_size: 16\n  input_shape: [1, 28, 28]\n")
    result = CliRunner().invoke(main, ["estimate", str(spec), "--method", "ml", "--json"])
    assert result.exit_code == 0, result.output
    est = json.loads(result.output)
    assert est["method"] == "ml-cnn" and est["peak_mib"] > 0
    missing = CliRunner().invoke(main, ["estimate", "--batch-size", "4"])
    assert missing.exit_code != 0 and "--model" in missing.output
    bad = CliRunner().invoke(main, ["estimate", "--model", "nowhere.at_all:f", "--batch-size", "4", "--input-shape", "3"])
    assert bad.exit_code != 0 and "cannot import" in bad.output


def test_a_trace_above_the_gpu_size_reserves_the_whole_gpu():
    est = estimate_for_workload("gpt2_large_2", 64, {})
    assert est.peak_mib == 40536 and "capped at the whole GPU" in est.method and "trace estimate" in est.notes
    fits = estimate_for_workload("gpt2_large_2", 8, {})
    assert fits.method.startswith("ours:trace-table(gpt2_large") and fits.peak_mib < 40536


def test_workload_estimate_reserves_best_plus_margin_and_keeps_the_wide_bound():
    auto = estimate_for_workload("resnet2", 64, {})
    best = estimate_for_workload("resnet2", 64, {}, safe=False)
    assert auto.peak_mib == pytest.approx(best.peak_mib * (1 + AUTO_MARGIN))
    assert auto.low_mib <= best.peak_mib < auto.peak_mib < auto.high_mib
