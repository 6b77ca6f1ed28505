"""Job-spec validation: every bad-input class gets a field-named error; nothing invalid passes."""

import pytest

from hier_sched.core.admission import AdmissionIndex
from hier_sched.core.spec import SpecError, check_fits, parse_spec


@pytest.mark.parametrize(
    "data,message",
    [
        ({"name": "a", "command": ["x"], "colour": "red"}, "colour: unknown field"),
        ({"name": "a", "command": ["x"], "memory_mib": -5}, "memory_mib"),
        ({"name": "a", "command": ["x"], "gpus": 0}, "gpus"),
        ({"name": "a", "command": "python train.py"}, "command: must be a list of strings"),
        ({"name": "a", "command": ["python", 3]}, "every argument must be a string"),
        ({"name": "a", "command": []}, "command must not be empty"),
        ({"command": ["x"]}, "name: required field missing"),
        ({"name": "a", "command": ["x"], "gpus": 3, "gpus_per_node": 2}, "multiple of gpus_per_node"),
        ({"name": "a", "command": ["x"], "estimator": "magic"}, "estimator"),
        ({"name": "a", "command": ["x"], "slot": {"length_s": 60, "grace_s": 600}}, "grace_s"),
        ({"name": "a", "command": ["x"], "model": {"input_shape": [3, 0, 224]}}, "input_shape"),
        ({"name": "a", "command": ["x"], "emulation": {"peak_mib": 100, "duration_s": 1, "smact": 1.5}}, "emulation.smact"),
        ({"name": "a"}, "give a command"),
        ({"name": "a", "command": ["x"], "entrypoint": "a.b:c"}, "either command or entrypoint"),
        ({"name": "a", "command": ["x"], "estimator": "oracle"}, "oracle"),
    ],
)
def test_bad_specs_name_the_field(data, message):
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert message in str(err.value)


def test_several_problems_are_reported_together():
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "a", "command": ["x"], "gpus": 0, "memory_mib": -1})
    assert len(err.value.problems) == 2


def test_a_bad_command_is_reported_with_the_other_problems():
    with pytest.raises(SpecError) as err:
        parse_spec({"name": "a", "command": "python train.py", "gpus": 0, "memory_mb": 100})
    assert err.value.problems == ["command: must be a list of strings (argv), not one string",
                                  "gpus: input should be greater than or equal to 1 (got 0)",
                                  "memory_mb: unknown field (did you mean memory_mib?)"]


@pytest.mark.parametrize("data,message", [
    ({"name": "a", "command": ["x"], "slot": {"length": 60}}, "slot.length: unknown field (did you mean length_s?)"),
    ({"name": "a", "command": ["x"], "model": {"factory": "m:f", "batchsize": 8}},
     "model.batchsize: unknown field (did you mean batch_size?)"),
    ({"name": "a", "command": ["x"], "training": {"hf_model_type": "llama", "seq_len": 8, "lora_rank": 8}},
     "training.lora_rank: unknown field (did you mean lora_r?)"),
    ({"name": "a", "command": ["x"], "retry": {"times": 2}},
     "retry.times: unknown field (the fields here: max_retries, on_exit_codes)"),
    ({"name": "a", "command": ["x"], "colour": "red"}, "colour: unknown field"),  # nothing close, and too many to list
])
def test_an_unknown_field_is_told_the_field_it_may_have_meant(data, message):
    with pytest.raises(SpecError) as err:
        parse_spec(data)
    assert message in err.value.problems


def test_gang_shape_that_no_node_holds():
    cluster = AdmissionIndex({"n0": [40536.0] * 4, "n1": [40536.0] * 4})
    ok = parse_spec({"name": "g", "command": ["x"], "gpus": 8, "gpus_per_node": 4})
    check_fits(ok, cluster)
    assert ok.nodes == 2 and ok.is_gang
    with pytest.raises(SpecError, match="gpus_per_node: 8 GPUs on one node"):
        check_fits(parse_spec({"name": "g", "command": ["x"], "gpus": 16, "gpus_per_node": 8}), cluster)
    with pytest.raises(SpecError, match="needs 3 nodes"):
        check_fits(parse_spec({"name": "g", "command": ["x"], "gpus": 12, "gpus_per_node": 4}), cluster)
    with pytest.raises(SpecError, match="largest GPU has 40536"):
        check_fits(parse_spec({"name": "g", "command": ["x"]}), cluster, need_mib=50000)
