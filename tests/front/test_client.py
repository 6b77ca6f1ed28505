"""The Python client: how ``est=`` becomes spec fields (``spec_from_est``), and batches of jobs (``submit_many``,
``hier-sched submit A B DIR``) against a queue in this process. No Ray."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    (lambda: None, {}),  # the user's own step: estimated in this process
    ({"step": "pkg.mod:one_step"}, {"model": {"step": "pkg.mod:one_step"}}),  # found nowhere here: on the cluster
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


class _QueueHere:
    """The client's connection, answered by a queue in this process (its nodes in-process fakes)."""

    def __init__(self, service):
        self.service = service
        self.calls: list[str] = []

    def call(self, method, *args):
        self.calls.append(method)
        return getattr(self.service, method)(*args)

    def submit_many(self, specs, payloads=None, estimates=None):
        self.calls.append("submit_many")
        return self.service.submit_many(specs, payloads, [f"request-{len(self.calls)}-{i}" for i in range(len(specs))],
                                        estimates)


def test_submit_many_sends_one_call_and_names_each_refused_job_while_the_others_are_queued(tmp_path, monkeypatch):
    import hier_sched.front.client as client
    from global_queue.service import QueueService
    from tests.helpers.fake_nodes import Nodes

    queue = QueueService(Nodes(), state_dir=tmp_path, estimator="none")
    here = _QueueHere(queue)
    monkeypatch.setattr(client, "connect", lambda: here)
    assert all(isinstance(h, client.JobHandle) for h in client.submit_many([["true"], ["true"]], est=1000))
    with pytest.raises(client.BatchRefused, match=r"0 of 3 accepted") as refused:
        client.submit_many([["true"], [], ["true"]], est=10**6)  # the empty argv: refused here; the others: too big
    assert refused.value.handles == [None, None, None]
    assert "command" in refused.value.refusals[1] and "40536 MiB" in refused.value.refusals[0]
    with pytest.raises(client.BatchRefused, match=r"2 of 3 accepted") as partly:
        client.submit_many([["true"], [], ["echo", "hi"]], est=1000)
    assert partly.value.refusals.keys() == {1} and "command" in partly.value.refusals[1]
    accepted = [h.job_id for h in partly.value.handles if h is not None]
    assert len(accepted) == 2 and queue.states(accepted) == dict.fromkeys(accepted, "queued")
    assert here.calls == ["submit_many"] * 3  # one call per batch
    queue.journal.close()


def test_submit_of_several_spec_files_and_a_directory_queues_the_good_ones_and_names_each_bad_one(tmp_path,
                                                                                                  monkeypatch):
    import json

    from click.testing import CliRunner

    import hier_sched.front.cluster_cli as cli
    from global_queue.service import QueueService
    from tests.helpers.fake_nodes import Nodes

    queue = QueueService(Nodes(), state_dir=tmp_path / "state", estimator="none")
    here = _QueueHere(queue)
    monkeypatch.setattr(cli, "_scheduler", lambda: here)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "a.yaml").write_text("name: a\ncommand: [\"true\"]\nmemory_mib: 1000\n")
    (specs / "b.json").write_text('{"name": "b", "command": ["true"], "memory_mib": 900000}')  # never fits
    (specs / "notes.txt").write_text("not a spec")
    (tmp_path / "c.yaml").write_text("name: c\ncommand: [true\n")  # not YAML
    (tmp_path / "d.yaml").write_text("name: d\ncommand: [\"true\"]\nmemory_mib: 2000\n")
    result = CliRunner().invoke(cli.submit, [str(specs), str(tmp_path / "c.yaml"), str(tmp_path / "d.yaml"), "--json"])
    assert result.exit_code == 2, result.output
    answers = {Path(a["spec"]).name: a for a in json.loads(result.stdout)}
    assert answers.keys() == {"a.yaml", "b.json", "c.yaml", "d.yaml"}  # the directory's spec files, not its notes
    assert "job_id" in answers["a.yaml"] and "job_id" in answers["d.yaml"]
    assert "'b'" in answers["b.json"]["error"] and "c.yaml" in answers["c.yaml"]["error"]
    assert here.calls == ["submit_many"]  # one call for all
    assert queue.states([answers["a.yaml"]["job_id"], answers["d.yaml"]["job_id"]]) == {
        answers["a.yaml"]["job_id"]: "queued", answers["d.yaml"]["job_id"]: "queued"}
    queue.journal.close()


def test_submit_many_with_the_users_step_traces_it_once_here_and_queues_every_job_on_it(tmp_path, monkeypatch):
    import hier_sched.front.client as client
    from global_queue.service import QueueService
    from tests.helpers.fake_nodes import Nodes

    def one_step():
        import torch
        from torch import nn

        model = nn.Linear(1024, 1024).cuda()
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(256, 1024, device="cuda")).sum().backward()
        opt.step()

    queue = QueueService(Nodes(), state_dir=tmp_path, estimator="none")
    here = _QueueHere(queue)
    monkeypatch.setattr(client, "connect", lambda: here)
    handles = client.submit_many([["true"], ["true"]], est=one_step)
    jobs = [queue.status(h.job_id) for h in handles]
    assert all("trace:user-step (in the submitting process" in j["estimate_source"] for j in jobs), jobs
    assert len({j["estimate_mib"] for j in jobs}) == 1 and jobs[0]["estimate_mib"] > 0
    assert here.calls == ["cluster", "submit_many"]  # the GPU types asked once, the step traced once
    queue.journal.close()
