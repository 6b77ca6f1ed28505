"""The security defaults of docs/security.md, each shown without a Ray cluster (the dashboard's
loopback binding is also checked live, in ``test_local_cluster.py``): commands run as argv, job
paths stay under the configured roots and job ids never name a path, the head's ``ray start``
flags and Ray's auth mode, MPS never shared between OS users, private state and job files,
and a job handed only its own id, paths and GPUs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from global_queue.peak_store import JsonPeakStore
from global_queue.service import QueueService
from hier_sched.common.checkpointing import CHECKPOINT_DIR_ENV, RESUME_ENV, checkpoint_dir
from hier_sched.common.messages import LaunchOrder, LaunchSpec
from hier_sched.common.paths import check_job_id
from hier_sched.common.private_files import NotOwnedError, private_dir
from hier_sched.core.events import Launch
from hier_sched.core.gpu import Placement
from hier_sched.core.placement import PlacementRequest
from hier_sched.core.presets import preset
from hier_sched.core.runtime_env import SCHEDULER_ENV
from hier_sched.core.spec import SpecError, parse_spec
from hier_sched.front.cluster_record import ClusterRecord, write_record
from hier_sched.front.local_cluster import ClusterConfig, LocalRayError, head_flags, ray_auth_env
from node_actor.backends.emulated import EmulatedBackend
from node_actor.emulated_device import emulated_now_s
from node_actor.launcher import run_process
from node_actor.mps import MpsController, MpsError
from node_actor.runtime import NodeRuntime
from tests.helpers.fake_nodes import Nodes


SCALE = 0.01


@pytest.fixture(autouse=True)
def loose_umask():
    """The usual umask of a shell (022): every private mode below is set by the code, not by it."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


class InlineLauncher:
    """Runs the job's process to its end inside ``launch`` (a Ray task, without Ray)."""

    def __init__(self):
        self.requests = []

    def launch(self, request, resources, env):
        self.requests.append(request)
        run_process(request)
        return request.job_id

    def failed(self, handle):
        return None

    def ended(self, handle):
        pass


def _node(tmp_path: Path) -> NodeRuntime:
    backend = EmulatedBackend(tmp_path / "devices", "A100-40GB", 2, time_scale=SCALE)
    node = NodeRuntime("n0", backend, preset("magm"), state_dir=tmp_path / "node", launcher=InlineLauncher(),
                       mps=MpsController(tmp_path / "mps"))
    node.tick(emulated_now_s(SCALE))
    return node


def _launch(node: NodeRuntime, job_id: str, spec: dict, gpu: int = 0, payload: bytes | None = None) -> None:
    launch = Launch(job_id, 1, (Placement(job_id, "n0", (gpu,), 3000.0),), 5000.0, PlacementRequest(job_id, 1, 3000.0))
    validated = parse_spec({"name": job_id, **spec}, callable_=(lambda: None) if payload is not None else None)
    reply = node.launch(LaunchOrder(launch, 0, LaunchSpec.of(validated), payload), emulated_now_s(SCALE))
    assert reply.launched, reply


# ---------------------------------------------------------------------- 1. argv, no shell
def test_a_command_runs_as_argv_and_no_shell_expands_it(tmp_path):
    node = _node(tmp_path)
    _launch(node, "echo-1", {"command": ["echo", "$HOME; touch x"], "workdir": str(tmp_path)})
    (request,) = node.runs.launcher.requests
    assert request.argv == ("echo", "$HOME; touch x")  # nothing wraps it in a shell
    log = (tmp_path / "node" / "jobs" / "echo-1" / "output.log").read_text()
    assert "$HOME; touch x\n" in log  # printed as given: no variable expanded
    assert not (tmp_path / "x").exists()  # and the ';' started no second command


def test_a_shell_runs_only_when_the_spec_names_one(tmp_path):
    with pytest.raises(SpecError, match="command: must be a list of strings"):
        parse_spec({"name": "one-string", "command": "echo $HOME; touch x"})
    node = _node(tmp_path)  # the explicit opt-in: the shell is the program, in plain sight
    _launch(node, "sh-1", {"command": ["/bin/sh", "-c", "echo $((6 * 7))"], "workdir": str(tmp_path)})
    assert "42\n" in (tmp_path / "node" / "jobs" / "sh-1" / "output.log").read_text()


# ---------------------------------------------------------------------- 2. paths
@pytest.mark.parametrize("bad", ["../other", "..", "a/b", "/etc", "", "x\0y", "a.b"])
def test_a_job_id_never_names_a_path(tmp_path, bad):
    with pytest.raises(ValueError, match="not a job id"):
        check_job_id(bad)
    with pytest.raises(ValueError, match="not a job id"):
        _node(tmp_path).runs.files(bad, 1)
    assert not (tmp_path / "other").exists()


def test_the_queue_makes_ids_from_any_name_that_stay_one_directory(tmp_path):
    svc = QueueService(Nodes(), state_dir=tmp_path / "state", policy="magm", estimator="none")
    answer = svc.submit({"name": "../../etc/passwd", "command": ["true"], "memory_mib": 1000})
    assert check_job_id(answer["job_id"]) and ".." not in answer["job_id"]


def _rooted(tmp_path: Path) -> tuple[QueueService, Path, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "work").mkdir(parents=True)
    outside.mkdir()
    svc = QueueService(Nodes(), state_dir=tmp_path / "state", policy="magm", estimator="none",
                       allowed_roots=[str(root)])
    return svc, root, outside


def _submit(svc: QueueService, **paths: str) -> dict:
    return svc.submit({"name": "p", "command": ["true"], "memory_mib": 1000, **paths})


def test_job_paths_inside_the_allowed_roots_are_accepted(tmp_path):
    svc, root, _ = _rooted(tmp_path)
    assert "job_id" in _submit(svc, workdir=str(root / "work"), checkpoint_dir="ckpt")
    assert "job_id" in _submit(svc, workdir=str(root / "work"), checkpoint_dir=str(root / "ckpt" / "new"))


def test_a_path_outside_the_allowed_roots_is_refused_naming_its_field(tmp_path):
    svc, root, outside = _rooted(tmp_path)
    (root / "work" / "link").symlink_to(outside)  # a symbolic link inside the root, leading out
    cases = {
        "workdir": dict(workdir=str(outside)),
        "checkpoint_dir": dict(workdir=str(root / "work"), checkpoint_dir="../../outside/ckpt"),  # '..' out
    }
    for field, paths in cases.items():
        answer = _submit(svc, **paths)
        assert answer["problems"][0].startswith(f"{field}: ") and "outside the allowed roots" in answer["error"]
    answer = _submit(svc, workdir=str(root / "work"), checkpoint_dir="link/ckpt")
    assert answer["problems"] == [f"checkpoint_dir: 'link/ckpt' (resolves to {outside / 'ckpt'}) is outside the "
                                  f"allowed roots ({root}; `hier-sched up --allowed-root`)"]
    answer = _submit(svc, workdir="relative/dir")  # relative to wherever Ray starts the job: unjudgeable
    assert answer["problems"][0].startswith("workdir: 'relative/dir' must be absolute")
    assert svc.status() == []  # nothing refused was queued


def test_without_allowed_roots_a_job_may_use_any_path_its_user_can(tmp_path):
    svc = QueueService(Nodes(), state_dir=tmp_path / "state", policy="magm", estimator="none")
    assert "job_id" in _submit(svc, workdir=str(tmp_path), checkpoint_dir="../elsewhere")
    with pytest.raises(ValueError, match="--allowed-root must be an absolute path"):
        ClusterConfig(allowed_roots=("relative",))


# ---------------------------------------------------------------------- 3. loopback, Ray auth
def test_the_head_serves_its_dashboard_on_loopback_only():
    flags = head_flags(6379, 8265, 20001)
    assert flags[flags.index("--dashboard-host") + 1] == "127.0.0.1"
    assert "--node-ip-address" not in flags  # Ray would replace a loopback one anyway (docs/security.md)


def test_ray_token_auth_is_off_unless_asked_for_even_with_a_token_file_lying_around(tmp_path):
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("a-stray-token")  # what any local ray.init() may leave
    assert ray_auth_env({}, tmp_path) == {"RAY_AUTH_MODE": "disabled"}
    assert ray_auth_env({"RAY_AUTH_MODE": "disabled"}, tmp_path) == {"RAY_AUTH_MODE": "disabled"}
    with pytest.raises(LocalRayError, match="Ray knows 'disabled' and 'token'"):
        ray_auth_env({"RAY_AUTH_MODE": "tokens"}, tmp_path)


def test_ray_token_auth_needs_a_token_and_keeps_its_file_private(tmp_path):
    with pytest.raises(LocalRayError, match="ray get-auth-token --generate"):
        ray_auth_env({"RAY_AUTH_MODE": "token"}, tmp_path)
    assert ray_auth_env({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "secret"}, tmp_path) == {"RAY_AUTH_MODE": "token"}
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("secret")  # as Ray writes it: the umask's mode, readable by every user
    assert _mode(token) == 0o644
    assert ray_auth_env({"RAY_AUTH_MODE": "token"}, tmp_path) == {"RAY_AUTH_MODE": "token"}
    assert _mode(token) == 0o600
    elsewhere = tmp_path / "token"
    elsewhere.write_text("secret")
    assert ray_auth_env({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(elsewhere)}, tmp_path)
    assert _mode(elsewhere) == 0o600


# ---------------------------------------------------------------------- 4. MPS per user
def test_the_mps_daemons_directories_are_this_users_only(tmp_path):
    mps = MpsController(tmp_path / "node", binary="false")  # a daemon that fails to start
    with pytest.raises(MpsError):
        mps.start()
    assert _mode(mps.pipe_dir) == 0o700 and _mode(mps.log_dir) == 0o700  # no other user reaches its socket
    assert set(mps.client_env().values()) == {str(mps.pipe_dir), str(mps.log_dir)}


def test_an_mps_directory_of_another_user_is_never_joined(tmp_path, monkeypatch):
    mps = MpsController(tmp_path / "node", binary="false")
    mps.pipe_dir.mkdir(parents=True)
    monkeypatch.setattr(os, "geteuid", lambda: mps.pipe_dir.stat().st_uid + 1)  # as another user sees it
    with pytest.raises(NotOwnedError, match="belongs to another user"):
        mps.start()


# ---------------------------------------------------------------------- 5. private files
def test_a_nodes_job_files_are_private(tmp_path):
    node = _node(tmp_path)
    _launch(node, "job-a", {"command": ["true"], "workdir": str(tmp_path)}, payload=b"pickled")
    jobs = tmp_path / "node" / "jobs"
    files = sorted(p.name for p in (jobs / "job-a").iterdir())
    assert {"output.log", "payload.pkl", "attempt1.json", "attempt1.pid", "attempt1.exit"} <= set(files)
    assert _mode(jobs / "job-a") == 0o700 and _mode(jobs) == 0o700 and _mode(tmp_path / "node") == 0o700
    assert {f: _mode(jobs / "job-a" / f) for f in files} == {f: 0o600 for f in files}
    devices = tmp_path / "devices"  # the emulated GPUs' file and its lock
    assert _mode(devices) == 0o700 and {_mode(f) for f in devices.iterdir()} == {0o600}


def test_the_queues_log_learned_peaks_and_cluster_note_are_private(tmp_path):
    svc = QueueService(Nodes(), state_dir=tmp_path / "state", policy="magm", estimator="none")
    svc.submit({"name": "a", "command": ["true"], "memory_mib": 1000})
    JsonPeakStore(tmp_path / "state" / "learned_peaks.json")["sig"] = 1000.0
    write_record(ClusterRecord("127.0.0.1:6379", str(tmp_path / "state"), None), tmp_path / "state")
    state = tmp_path / "state"
    dirs = [state, *(p for p in state.rglob("*") if p.is_dir())]
    files = [p for p in state.rglob("*") if p.is_file()]
    assert len(files) >= 4  # log segment, its lock, learned peaks, the cluster note
    assert {str(d): _mode(d) for d in dirs} == {str(d): 0o700 for d in dirs}
    assert {str(f): _mode(f) for f in files} == {str(f): 0o600 for f in files}


def test_the_checkpoint_helper_creates_a_private_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(CHECKPOINT_DIR_ENV, str(tmp_path / "ckpt"))
    assert _mode(checkpoint_dir()) == 0o700


def test_private_dir_tightens_a_loose_directory(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    assert _mode(private_dir(loose)) == 0o700


# ---------------------------------------------------------------------- 6. one job, its own things
def test_a_job_is_handed_only_its_own_id_paths_and_gpus(tmp_path):
    node = _node(tmp_path)
    _launch(node, "job-a", {"command": ["true"], "workdir": str(tmp_path / "a"), "checkpoint_dir": "ckpt"}, gpu=0)
    _launch(node, "job-b", {"command": ["true"], "workdir": str(tmp_path / "b"), "checkpoint_dir": "ckpt"}, gpu=1)
    a, b = node.runs.launcher.requests
    assert b.env[CHECKPOINT_DIR_ENV] == str(tmp_path / "b" / "ckpt") and b.env["CUDA_VISIBLE_DEVICES"] == node.backend.uuids()[1]
    handed_to_b = " ".join([*b.argv, *b.env.values(), b.files.directory])
    assert "job-a" not in handed_to_b and str(tmp_path / "a") not in handed_to_b
    assert b.files.directory != a.files.directory


@pytest.mark.parametrize("name", [*SCHEDULER_ENV, "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
def test_a_spec_cannot_set_what_the_scheduler_sets_for_the_job(name):
    for where, spec in (("env", {"env": {name: "x"}}), ("runtime_env", {"runtime_env": {"env_vars": {name: "x"}}})):
        with pytest.raises(SpecError, match="set by the scheduler") as err:
            parse_spec({"name": "j", "command": ["true"], **spec})
        assert err.value.problems[0].startswith(where)
    assert {CHECKPOINT_DIR_ENV, RESUME_ENV} <= set(SCHEDULER_ENV)  # the checkpoint protocol's own names
