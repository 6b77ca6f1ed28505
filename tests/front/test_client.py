"""How the Python client turns ``est=`` into spec fields (hier_sched.front.client.spec_from_est). No Ray."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hier_sched.core.spec import SpecError
from hier_sched.front.client import spec_from_est


@dataclass
class _Estimate:
    peak_mib: float


@pytest.mark.parametrize("est, fields", [
    (7106, {"memory_mib": 7106.0}),
    ("none", {"estimator": "none"}),
    ({"factory": "pkg.mod:build", "batch_size": 64}, {"model": {"factory": "pkg.mod:build", "batch_size": 64}}),
    (_Estimate(2048.5), {"memory_mib": 2048.5}),
    (None, {}),
])
def test_est_forms_become_spec_fields(est, fields):
    assert spec_from_est(est) == fields


@pytest.mark.parametrize("bad", [True, [1, 2], object()])
def test_unusable_est_is_a_spec_error(bad):
    with pytest.raises(SpecError, match="est:"):
        spec_from_est(bad)


def test_a_factory_this_process_has_is_estimated_here_and_left_out_of_the_spec(tmp_path, monkeypatch):
    """An object or callable, or a string whose module is on this process's path (found without
    importing it): estimated before submitting. Any other string goes to the cluster."""
    (tmp_path / "hs_client_models.py").write_text("raise RuntimeError('imported while only looking')\n")
    (tmp_path / "hs_client_pkg").mkdir()
    (tmp_path / "hs_client_pkg" / "__init__.py").write_text("raise RuntimeError('imported while only looking')\n")
    (tmp_path / "hs_client_pkg" / "nets.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for factory in ("hs_client_models:build", "hs_client_pkg.nets:build", lambda: None):
        assert spec_from_est({"factory": factory, "batch_size": 8}) == {"model": {"batch_size": 8}}
    assert spec_from_est({"factory": "hs_client_pkg.absent:build", "batch_size": 8}) == {
        "model": {"factory": "hs_client_pkg.absent:build", "batch_size": 8}}
