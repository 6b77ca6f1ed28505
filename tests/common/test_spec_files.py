"""Job specs from files (hier_sched.common.spec_files): YAML, TOML and JSON load; unreadable and malformed
files get an error naming what is wrong."""

import pytest

from hier_sched.common.spec_files import load_spec
from hier_sched.core.spec import SpecError

CONTRACT = """
name: resnet50-bs64
command: ["python", "train.py", "--batch-size", "64"]
gpus: 1
gpus_per_node: 1
memory_mib: 7106
estimator: auto
model:
  factory: "pkg.mod:build"
  batch_size: 64
  input_shape: [3, 224, 224]
  optimizer: adam
priority: 0
slot: {length_s: 43200, grace_s: 600}
checkpoint_dir: ./ckpt
emulation:
  peak_mib: 7106
  duration_s: 2130
  smact: 0.64
"""


def test_the_contract_example_loads(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text(CONTRACT)
    spec = load_spec(p)
    assert spec.name == "resnet50-bs64" and spec.command[0] == "python"
    assert spec.model.input_shape == (3, 224, 224) and spec.slot.length_s == 43200
    assert spec.emulation.peak_mib == 7106 and spec.nodes == 1


def test_toml_and_json(tmp_path):
    (tmp_path / "a.toml").write_text('name = "a"\ncommand = ["true"]\ngpus = 2\n')
    (tmp_path / "b.json").write_text('{"name": "b", "entrypoint": "pkg.mod:fn"}')
    assert load_spec(tmp_path / "a.toml").gpus == 2
    assert load_spec(tmp_path / "b.json").entrypoint == "pkg.mod:fn"


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(SpecError, match="cannot read file"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid yaml"):
        load_spec(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="expected a mapping"):
        load_spec(lst)
