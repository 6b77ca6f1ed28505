"""GPUMemNet's transformer schema: shape parsing, the closed form against our own trace, and the
attention of a trace matching what a GPU keeps."""

import csv

import pytest
import torch

from estimators.data import gpumemnet_dir
from estimators.encoder_memory import GPUMEMNET_BASELINE_MIB, TransformerShape, transformer_encoder_memory
from estimators.table import estimate_rows
from estimators.trace_estimator import trace_memory
from estimators.transformer_rows import shape_from_row
from estimators.types import EstimatorError
from estimators.zoo.encoder_classifier import EncoderClassifier


def _layer_list(embed, ff, layers, vocab, classes, batch, seq):
    block = [("Linear", batch * embed, embed * embed + embed), ("Linear", batch * ff, embed * ff + ff),
             ("Dropout", ff, 0), ("Linear", batch * embed, ff * embed + embed), ("LayerNorm", embed, 2 * embed),
             ("LayerNorm", embed, 2 * embed), ("Dropout", embed, 0), ("Dropout", embed, 0)]
    items = [("Embedding", batch * seq * embed, vocab * embed), *block * layers, ("Linear", batch * classes, embed * classes + classes)]
    return "[" + ", ".join(f"('{n}', {a}, {p})" for n, a, p in items) + "]"


def row(batch=8, seq=256, embed=128, layers=3, heads=2, ff=344, vocab=267646, classes=570):
    # GPUMemNet's columns; its totals follow another convention and must not be checked.
    return {"Batch Size": str(batch), "Seq Length": str(seq), "Embedding Size": str(embed), "Num Layers": str(layers),
            "Num Heads": str(heads), "Activations-Params": _layer_list(embed, ff, layers, vocab, classes, batch, seq),
            "Total Activations": "46442", "Total Parameters": "35133650"}


def test_the_shape_comes_from_the_columns_and_the_layer_parameters():
    shape = shape_from_row(row())
    assert shape == TransformerShape(8, 256, 128, 3, 2, 344, 267646, 570)
    per_layer = 4 * 128 * 128 + 4 * 128 + 2 * 128 * 344 + 344 + 128 + 4 * 128
    assert shape.params == 267646 * 128 + 3 * per_layer + 128 * 570 + 570


@pytest.mark.parametrize("column, value, message", [
    ("Seq Length", "nan", "Seq Length"), ("Embedding Size", "100", "Embedding"), ("Batch Size", "-4", "Batch Size"),
    ("Activations-Params", "[('Embedding', 5, 1280), ('Linear', 5, 12345)]", "12345 parameters"),
])
def test_bad_rows_name_the_problem(column, value, message):
    bad = dict(row(), **{column: value})
    with pytest.raises(EstimatorError, match=message):
        shape_from_row(bad, "row 7")


def test_the_table_estimates_good_rows_and_reports_bad_ones():
    rows = [row(), dict(row(), **{"Num Layers": "x"}), row(batch=64, seq=512, layers=8, ff=332, vocab=553893)]
    result = estimate_rows("transformer", rows)
    assert result.method == "transformer-formula" and set(result.errors) == {1}
    assert result.predicted_mib[2] > result.predicted_mib[0] > GPUMEMNET_BASELINE_MIB
    assert (result.low_mib[[0, 2]] < result.predicted_mib[[0, 2]]).all()


def test_the_closed_form_follows_our_trace_of_the_same_model():
    shape = TransformerShape(16, 256, 256, 4, 4, 1024, 300000, 300)
    traced = trace_memory(lambda: EncoderClassifier(shape.vocab, shape.embed, shape.layers, shape.heads, shape.ff,
                                                    shape.classes),
                          batch_size=shape.batch, sample_input=torch.randint(0, shape.vocab, (shape.batch, shape.seq)))
    ours = transformer_encoder_memory(shape).peak_mib - GPUMEMNET_BASELINE_MIB
    assert ours == pytest.approx(traced.peak_mib - 518, rel=0.15)


def test_the_baseline_is_the_smallest_peak_of_the_gpumemnet_mlp_data():
    with (gpumemnet_dir() / "mlp_step1.csv").open(newline="") as fh:
        peaks = [float(r["Max GPU Memory (MiB)"]) for r in csv.DictReader(fh)]
    assert min(p for p in peaks if p > 0) == GPUMEMNET_BASELINE_MIB


def test_a_trace_keeps_no_attention_matrix_even_with_dropout():
    def encoder(dropout):
        return lambda: EncoderClassifier(1000, 64, 2, 4, 128, 10, dropout)

    batch = torch.randint(0, 1000, (8, 1024))  # S x S = 1 M per head: a kept matrix would dominate
    with_dropout = trace_memory(encoder(0.1), batch_size=8, sample_input=batch).peak_mib
    without = trace_memory(encoder(0.0), batch_size=8, sample_input=batch).peak_mib
    assert with_dropout < 1.5 * without
