"""A local Ray cluster for ``hier-sched up`` without ``--address``, made of real ``ray start``
processes: a head and one worker per further node, on this machine.

Each node declares the resources the node actors launch jobs with: ``hs_node_<name>`` (which
node is which) and one ``hs_<name>_gpu<i>_mem_mib`` per GPU, sized to the GPU type's memory;
``GPU`` is fungible on them (``ray_start_env``). The head
binds its dashboard to 127.0.0.1 (``ray job submit --address`` and ``hier-sched info`` use it)
(``head_flags``); Ray's token authentication is on when
``RAY_AUTH_MODE=token`` is set, explicitly off otherwise (``ray_auth_env``; docs/security.md).

Why ``ray start`` rather than a Python process holding ``ray.cluster_utils.Cluster``: no process
of ours owns the cluster, so nothing but ``down`` ends it, and it is the same cluster a user of a
real machine starts — ``up --address`` and ``up`` run the very same attach code on it. Start-up
costs the same (both start the same Ray processes; BENCHMARKS.md, "Live system on Ray").

Stopping: each ``ray start`` runs in its own session, and every process it leaves behind (GCS,
raylet, dashboard and agents, workers, the jobs they run) keeps that session id, also after it
is re-parented or renames itself (``ray::DashboardAgent``). ``stop_local_ray`` ends exactly
those sessions — never ``ray stop``, which ends every Ray cluster on the machine. Ray's session
directory (its logs) stays, as after any Ray cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from hier_sched.front.cluster_record import LocalRay

__all__ = ["ClusterConfig", "free_port", "start_local_ray", "stop_local_ray", "local_ray_alive", "wait_for_nodes",
           "LocalRayError", "SCHEDULER_NODE_PREFIX", "head_flags", "ray_auth_env", "kill_local_node",
           "restart_local_node", "restart_local_head"]

SCHEDULER_NODE_PREFIX = "node"  # scheduler node names: node0 (the head), node1, ...
_DASHBOARD_PORT = 8265
_START_TIMEOUT_S = 120.0
_HEAD_ATTEMPTS = 3
_WORKER_ATTEMPTS = 3
_SESSION_DIR = re.compile(r"([^\s=]*/session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_\d+)")
_RAY_CLIENT_PORT_FLOOR = 20000  # FIELD_NOTES §3: keep the client server port outside 10002-19999
_ADDRESS_NOTE = "ray_current_cluster"  # in Ray's temp dir: the last head's address, what "auto" reads
# what `ray start --head` says when trying again may help: a port it was given was taken in between,
# or its raylet missed its start-up deadline on a busy machine
_HEAD_TRY_AGAIN = ("already occupied", "already in use", "timed out during startup")


DEFAULT_GPU_TYPE = "A100-40GB"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """A cluster's set-up. Its nodes: ``node_specs``, (GPU type, GPUs) of each node in order
    (``up --node TYPE:N``, repeatable); without them ``nodes`` x ``gpus_per_node`` GPUs of the
    default type (the uniform shorthand). Either way ``nodes`` and ``gpus_per_node`` (the largest
    node's) are set from the other."""

    nodes: int = 2
    gpus_per_node: int = 4
    node_specs: tuple[tuple[str, int], ...] = ()
    time_scale: float = 1.0
    policy: str = "auto"
    estimator: str = "auto"
    backend: str = "emulated"
    sharing: str = "mps"
    address: str | None = None  # attach to this Ray cluster instead of starting one
    cpus_per_node: int = 2
    mps_daemon: bool = False  # real GPUs: each node actor runs its own nvidia-cuda-mps-control
    allowed_roots: tuple[str, ...] = ()  # job paths (workdir, checkpoint_dir) must lie under one; () anywhere
    # (min, max) GPU workers Ray's autoscaler keeps (``autoscaling``): the head has no GPU, and
    # ``node_specs[0]`` is the workers' node type
    autoscale: tuple[int, int] | None = None
    idle_timeout_s: float = 60.0  # an autoscaled worker idle this long is removed

    def node_spec(self, name: str) -> tuple[str, int]:
        """(GPU type, GPUs) of the scheduler node ``name`` (``node{i}``); a node past the
        configured ones (an attached cluster's) is like the first."""
        index = name[len(SCHEDULER_NODE_PREFIX):]
        i = int(index) if name.startswith(SCHEDULER_NODE_PREFIX) and index.isdigit() else 0
        return self.node_specs[i] if i < len(self.node_specs) else self.node_specs[0]

    def describe_nodes(self) -> str:
        """``2 node(s): node0 2x A100-40GB, node1 2x H100-80GB``."""
        return f"{self.nodes} node(s): " + ", ".join(f"{SCHEDULER_NODE_PREFIX}{i} {g}x {t}"
                                                     for i, (t, g) in enumerate(self.node_specs))

    def __post_init__(self) -> None:
        from hier_sched.core.gpu_types import gpu_type

        if self.node_specs:
            specs = tuple((str(t), int(g)) for t, g in self.node_specs)  # (a record's JSON has lists)
            for name, gpus in specs:
                gpu_type(name)
                if gpus < 1:
                    raise ValueError(f"--node {name}:{gpus}: a node needs at least 1 GPU")
            object.__setattr__(self, "node_specs", specs)
            object.__setattr__(self, "nodes", len(specs))
            object.__setattr__(self, "gpus_per_node", max(g for _, g in specs))
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"need at least 1 node and 1 GPU per node (got {self.nodes} x {self.gpus_per_node})")
        if not self.node_specs:
            object.__setattr__(self, "node_specs", ((DEFAULT_GPU_TYPE, self.gpus_per_node),) * self.nodes)
        if self.time_scale <= 0:
            raise ValueError(f"--time-scale must be > 0 (got {self.time_scale})")
        if relative := [r for r in self.allowed_roots if not os.path.isabs(os.path.expanduser(r))]:
            raise ValueError(f"--allowed-root must be an absolute path (got {relative[0]!r})")
        if self.autoscale is not None:
            low, high = (int(n) for n in self.autoscale)
            object.__setattr__(self, "autoscale", (low, high))
            if not 0 <= low <= high or high < 1:
                raise ValueError(f"--autoscale MIN:MAX needs 0 <= MIN <= MAX and MAX >= 1 (got {low}:{high})")
            if self.address is not None or self.backend != "emulated" or len(set(self.node_specs)) > 1:
                raise ValueError("--autoscale starts a local cluster of emulated GPU workers of one type: "
                                 "not with --address, a real-GPU backend or several --node types")
            if self.idle_timeout_s <= 0:
                raise ValueError(f"--idle-timeout-s must be > 0 (got {self.idle_timeout_s})")


class LocalRayError(RuntimeError):
    """A ``ray start`` of the local cluster failed (the message carries its output)."""


def free_port(preferred: int | None = None, floor: int = 0) -> int:
    """``preferred`` when it is free, else a free port (above ``floor`` when given)."""
    candidates = ([preferred] if preferred else []) + list(range(floor, floor + 2000) if floor else [0])
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free TCP port")


def _node_argv(config: ClusterConfig, index: int) -> list[str]:
    """``ray start`` for node ``index`` (head or worker: the caller adds the rest)."""
    from hier_sched.core.gpu_types import gpu_type
    from node_actor.launcher import NODE_RESOURCE_PREFIX, gpu_resource

    name = f"{SCHEDULER_NODE_PREFIX}{index}"
    kind, count = config.node_spec(name)
    capacity = float(gpu_type(kind).memory_mib)
    resources = {f"{NODE_RESOURCE_PREFIX}{name}": 1.0,
                 **{gpu_resource(name, g): capacity for g in range(count)}}
    # emulated GPUs are declared to Ray as a GPU node's are detected, so plain Ray tasks asking for
    # (fractions of) GPUs run beside the scheduler's jobs, as on a real cluster
    gpus = ["--num-gpus", str(count)] if config.backend == "emulated" else []
    return [_ray_cli(), "start", "--num-cpus", str(config.cpus_per_node), *gpus, "--resources", json.dumps(resources),
            # each node's agent on its own port: two nodes on one machine would both want 52365
            "--dashboard-agent-listen-port", str(free_port())]


def start_local_ray(config: ClusterConfig) -> tuple[LocalRay, str, str]:
    """Start the head and the worker nodes; returns (what to stop, GCS address, dashboard URL).
    On failure everything started so far is stopped again."""
    sessions: list[int] = []
    if config.autoscale is not None:
        return _start_autoscaling_head(config, sessions)
    try:
        address, dashboard = _start_head(_node_argv(config, 0), sessions)
        local = LocalRay(_session_dir(sessions[0]), sessions, port=int(address.rsplit(":", 1)[1]))
        for i in range(1, config.nodes):  # one at a time: two `ray start`s at once can pick one socket name
            sessions.append(_start_worker(config, i, address))
    except BaseException:
        _end_processes(_members(sessions))  # seconds old: these session numbers are still ours
        raise
    return local, address, dashboard


def _start_autoscaling_head(config: ClusterConfig, sessions: list[int]) -> tuple[LocalRay, str, str]:
    """The head alone, without GPUs, running Ray's autoscaler: it adds the GPU workers
    (``autoscaling``)."""
    from hier_sched.front.autoscaling import autoscaling_env, write_autoscaling_config

    def autoscaled(port: int) -> tuple[list[str], dict[str, str]]:
        path = write_autoscaling_config(config, f"127.0.0.1:{port}", cluster_temp_dir(port))
        return ["--autoscaling-config", str(path)], autoscaling_env()

    argv = [_ray_cli(), "start", "--num-cpus", str(config.cpus_per_node), "--num-gpus", "0",
            "--dashboard-agent-listen-port", str(free_port())]
    try:
        address, dashboard = _start_head(argv, sessions, autoscaled)
    except BaseException:
        _end_processes(_members(sessions))
        raise
    return LocalRay(_session_dir(sessions[0]), sessions, port=int(address.rsplit(":", 1)[1])), address, dashboard


def restart_local_node(local: LocalRay, config: ClusterConfig, address: str, index: int) -> LocalRay:
    """Start worker node ``index`` again (after ``kill_local_node``: a machine that comes back, or
    its replacement under the same name); returns ``local`` with the new node's session in
    place of the old one, which ``stop_local_ray`` and ``kill_local_node`` then reach."""
    if index == 0 or index >= len(local.sessions):
        raise ValueError(f"node {index} is not a worker node of this cluster (1..{len(local.sessions) - 1})")
    if any(_running(p) for p in _members([local.sessions[index]])):
        raise LocalRayError(f"node {index} still runs; kill it first")
    sessions = list(local.sessions)
    sessions[index] = _start_worker(config, index, address)
    return LocalRay(local.session_dir, sessions, local.port)


def _start_worker(config: ClusterConfig, index: int, address: str) -> int:
    """``ray start`` worker node ``index``; returns its session. On a busy machine a raylet can
    miss its start-up deadline ("node registration may not be complete"): what that start left
    behind is ended and it is tried again."""
    attempt = 1
    while True:
        started: list[int] = []
        try:
            _ray_start(_node_argv(config, index) + ["--address", address], started)
            return started[0]
        except LocalRayError:
            _end_processes(_members(started))
            if attempt == _WORKER_ATTEMPTS:
                raise
            attempt += 1


def _start_head(argv: list[str], sessions: list[int],
                for_port: Callable[[int], tuple[list[str], dict[str, str]]] | None = None) -> tuple[str, str]:
    """Start the head on free ports; again on others when one was taken in between (other
    clusters on this machine start too, and the dashboard's 8265 is everybody's favourite).

    Each cluster has a Ray temp dir of its own (``cluster_temp_dir``): Ray's job supervisor gives
    a job's driver the address that "auto" finds in *its* cluster's temp dir, so with the shared
    default a ``ray job submit --address <ours> -- hier-sched run`` (or a ``ray.init()`` in a
    job) on a machine running two clusters reached the one started last. The head's address is
    noted in Ray's default temp dir as well, so a plain ``ray status`` or ``ray.init("auto")``
    on this machine finds the cluster ``up`` started last, as after any ``ray start --head``.
    ``for_port``: further flags and environment that name the head's port."""
    attempt = 0
    while True:
        port, dashboard_port = free_port(), free_port(_DASHBOARD_PORT if attempt == 0 else None)
        flags, env = for_port(port) if for_port else ([], {})
        try:
            _ray_start(argv + head_flags(port, dashboard_port, free_port(floor=_RAY_CLIENT_PORT_FLOOR))
                       + ["--temp-dir", str(cluster_temp_dir(port)), *flags], sessions, env)
            _note_address(DEFAULT_TEMP_DIR, port)
            return f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard_port}"
        except LocalRayError as exc:
            attempt += 1
            if attempt == _HEAD_ATTEMPTS or not any(s in str(exc) for s in _HEAD_TRY_AGAIN):
                raise
            _end_processes(_members([sessions.pop()]))


DEFAULT_TEMP_DIR = Path("/tmp/ray")  # Ray's, where "auto" looks outside a cluster's own processes


def cluster_temp_dir(port: int) -> Path:
    """The Ray temp dir of the local cluster whose GCS listens on ``port``: short, as Ray's
    socket paths under it must stay within the 107 characters a Unix socket name may have."""
    return Path(tempfile.gettempdir()) / f"hs-ray-{port}"


def _note_address(temp_dir: Path, port: int) -> None:
    """What ``ray start --head`` writes in its temp dir for "auto" to read."""
    try:
        temp_dir.mkdir(parents=True, exist_ok=True)
        (temp_dir / _ADDRESS_NOTE).write_text(f"127.0.0.1:{port}")
    except OSError:
        pass  # only a convenience for plain Ray commands


def head_flags(port: int, dashboard_port: int, client_port: int) -> list[str]:
    """The head's ``ray start`` flags. The dashboard serves Ray's job-submission API, which runs
    any command it is sent: it listens on loopback only (reach it from elsewhere through an SSH
    tunnel). Ray's other ports (GCS, raylet, Ray client server, metrics export) listen on the
    node's address whatever we ask -- ``ray start`` replaces a loopback ``--node-ip-address`` --
    and are what ``RAY_AUTH_MODE=token`` protects (docs/security.md)."""
    return ["--head", "--port", str(port), "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(dashboard_port), "--ray-client-server-port", str(client_port)]


def ray_auth_env(environ: Mapping[str, str], home: Path) -> dict[str, str]:
    """``RAY_AUTH_MODE`` for the ``ray start`` processes, always given explicitly: a token file
    left in ``~/.ray/auth_token`` (any local ``ray.init()`` may write one) must not turn token
    authentication on by itself, after which every client without the token fails (FIELD_NOTES
    §3). ``RAY_AUTH_MODE=token`` in ``environ`` turns it on, for a cluster others can reach; then
    the token must exist (``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH`` names, or
    ``~/.ray/auth_token``), and a token file readable by other users is made private (0600):
    Ray writes it with the umask's mode, typically readable by every user of the machine."""
    mode = environ.get("RAY_AUTH_MODE", "").strip().lower() or "disabled"
    if mode == "disabled":
        return {"RAY_AUTH_MODE": "disabled"}
    if mode != "token":
        raise LocalRayError(f"RAY_AUTH_MODE={environ['RAY_AUTH_MODE']!r}: Ray knows 'disabled' and 'token'")
    if environ.get("RAY_AUTH_TOKEN", "").strip():
        return {"RAY_AUTH_MODE": "token"}
    path = Path(environ.get("RAY_AUTH_TOKEN_PATH") or home / ".ray" / "auth_token").expanduser()
    try:
        present = bool(path.read_text().strip())
    except OSError:
        present = False
    if not present:
        raise LocalRayError(f"RAY_AUTH_MODE=token, but no token in RAY_AUTH_TOKEN nor in {path}: create one with "
                            "`ray get-auth-token --generate` (or set RAY_AUTH_TOKEN_PATH to a file holding one)")
    if path.stat().st_mode & 0o077:
        try:
            path.chmod(0o600)
        except OSError as exc:
            raise LocalRayError(f"the Ray token file {path} is readable by other users and cannot be made "
                                f"private ({exc.strerror}): `chmod 600 {path}`") from None
    return {"RAY_AUTH_MODE": "token"}


def _session_dir(session: int) -> str:
    """The Ray session directory the processes of ``session`` name (each cluster has its own)."""
    import psutil

    for p in _members([session]):
        try:
            for arg in p.cmdline():
                if found := _SESSION_DIR.search(arg):
                    return found.group(1)
        except psutil.Error:
            continue
    raise LocalRayError("the Ray head started, but none of its processes names a session directory")


IDLE_WORKER_ENV = "RAY_idle_worker_killing_time_threshold_ms"
IDLE_WORKER_KEEP_MS = 60_000
FUNGIBLE_ENV = "RAY_predefined_unit_instance_resources"  # Ray's unit-instance resources; empty: none


def _ray_cli() -> str:
    """The ``ray`` next to this Python (the project's environment), else the one on PATH."""
    here = Path(sys.executable).with_name("ray")
    return str(here) if here.exists() else "ray"


def ray_start_env(environ: Mapping[str, str], home: Path) -> dict[str, str]:
    """The environment of a ``ray start`` of ours."""
    env = {k: v for k, v in environ.items() if k != "RAY_ADDRESS"}  # the head must not look for another cluster
    env.update(ray_auth_env(environ, home))
    # Ray jobs on this cluster (`ray job submit -- hier-sched run ...`) find our command line
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # Every running job holds a Ray worker (its reservation's task). Ray kills the idle workers
    # beyond a node's CPU count after 1 s, so bursts of short jobs started a fresh worker process
    # for most jobs (114 for 1,000 jobs; BENCHMARKS.md, "Dispatch"): idle ones are kept a minute.
    env.setdefault(IDLE_WORKER_ENV, str(IDLE_WORKER_KEEP_MS))
    # GPU as fungible as CPU: a node's fractions must add up, and Ray no longer packs them onto
    # GPU instances of its own choosing. The scheduler picks the GPU (CUDA_VISIBLE_DEVICES is
    # set on the job's process); a job task asks for its share, which Ray then never refuses
    # for want of room on "its" instance (node_actor.launcher). Plain Ray GPU tasks on such a
    # cluster all see the same CUDA_VISIBLE_DEVICES (docs/dashboard.md).
    env.setdefault(FUNGIBLE_ENV, "")
    return env


def _ray_start(argv: list[str], sessions: list[int], extra_env: Mapping[str, str] | None = None) -> None:
    env = {**ray_start_env(os.environ, Path.home()), **(extra_env or {})}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    sessions.append(proc.pid)
    try:
        output, _ = proc.communicate(timeout=_START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        raise LocalRayError(f"`{' '.join(argv[:3])} ...` did not finish in {_START_TIMEOUT_S:.0f} s:\n"
                            f"{output[-1500:]}") from None
    if proc.returncode != 0:
        raise LocalRayError(f"`{' '.join(argv[1:3])} ...` failed with exit code {proc.returncode}:\n{output[-1500:]}")


def _members(sessions: list[int]) -> list:
    """The live processes of these sessions."""
    import psutil

    members = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) in sessions:
                members.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def local_ray_processes(local: LocalRay) -> list:
    """The live processes of ``local``, provided one of them still names its session directory:
    a session's number is ours only while our processes hold it, and may be reused later."""
    import psutil

    members = _members(local.sessions)
    for p in members:
        try:
            if any(local.session_dir in arg for arg in p.cmdline()):
                return members
        except psutil.Error:
            continue
    return []


def local_ray_alive(local: LocalRay) -> bool:
    return bool(local_ray_processes(local))


def stop_local_ray(local: LocalRay, grace_s: float = 2.0) -> int:
    """SIGTERM the local cluster's processes, SIGKILL what is left after ``grace_s``; returns how
    many there were. Workers and the dashboard exit within ~2 s; raylets and the GCS drain for
    10 s or more, or not at all (measured: BENCHMARKS.md, "Control plane"), and by then the
    node actors have ended every job, so nothing is lost by not waiting for them."""
    procs = local_ray_processes(local)
    _end_processes(procs, grace_s)
    # the head's notes for "auto" (as `ray stop` does): left behind, a plain ray.init() on this
    # machine would try to join the dead cluster instead of starting its own
    for note in (Path(local.session_dir).parent / _ADDRESS_NOTE, DEFAULT_TEMP_DIR / _ADDRESS_NOTE):
        try:
            if note.read_text().strip().rsplit(":", 1)[-1] == str(local.port):
                note.unlink()
        except OSError:
            pass
    return len(procs)


def kill_local_node(local: LocalRay, index: int, node_state_dir: str | Path) -> int:
    """Take worker node ``index`` of the local cluster away, as a machine that dies would: its Ray
    processes, its fork servers and the jobs they ran (their own process groups, found from the
    node's run files) are killed at once. For failure tests and the chaos benchmark; returns how many processes."""
    if index == 0:
        raise ValueError("node 0 is the head: killing it ends the cluster "
                         "(restart_local_head kills it and starts it again)")
    return _kill_machine(local, index, Path(node_state_dir))


def restart_local_head(local: LocalRay, config: ClusterConfig, node_state_dir: str | Path,
                       dashboard_port: int) -> LocalRay:
    """Kill the head as a machine that dies (its Ray processes, the GCS among them, and node 0's
    jobs), then start it again on the same ports, as Kubernetes restarts a head pod. The workers
    and their jobs live through it only under GCS fault tolerance (``RAY_REDIS_ADDRESS`` set for
    ``up`` and for this: the new GCS reads the cluster back from Redis); without it the workers'
    raylets give up on the GCS after a minute. Returns ``local`` with the new head's session."""
    if config.autoscale is not None:
        raise ValueError("restarting the head of an autoscaling local cluster is not supported")
    _kill_machine(local, 0, Path(node_state_dir))
    # A new head machine holds no note of a running cluster. This one does, and `ray start --head`
    # refuses a port its note names while any process names that address (the workers' raylets).
    (Path(local.session_dir).parent / _ADDRESS_NOTE).unlink(missing_ok=True)
    sessions: list[int] = []
    _ray_start(_node_argv(config, 0) + head_flags(local.port, dashboard_port, free_port(floor=_RAY_CLIENT_PORT_FLOOR))
               + ["--temp-dir", str(cluster_temp_dir(local.port))], sessions)
    return replace(local, sessions=[sessions[0], *local.sessions[1:]])


def _kill_machine(local: LocalRay, index: int, node_state_dir: Path) -> int:
    """Node ``index``'s Ray processes, fork servers and jobs, killed at once; how many processes."""
    import psutil

    killed = 0
    for _ in range(5):  # again while any is left: a worker killed a moment late may have started more
        # The fork servers are frozen before anything dies: a server outliving one of its jobs
        # would record that death, as no dead machine does. Each pass looks for them again: a Ray
        # worker of the node not yet killed may have started a new server after the last pass.
        servers = _fork_servers(node_state_dir)
        for p in servers:
            with contextlib.suppress(psutil.Error):
                p.suspend()
        groups = [g for g in map(_job_group, node_state_dir.glob("jobs/*/attempt*.pid")) if g is not None]
        procs = servers + _members([local.sessions[index]])
        procs += [p for p in psutil.process_iter(["pid"]) if any(_in_group(p.pid, g) for g in groups)]
        if not procs:
            break
        _end_processes(procs, grace_s=0.0)  # a machine that dies sends no SIGTERM first
        killed += len(procs)
    return killed


def _fork_servers(node_state_dir: Path) -> list:
    """The node's fork servers (``node_actor.fork_server``) and the stages they forked (which
    keep the server's command line), found by that command line: a server still starting has
    not written its address file yet."""
    import psutil

    wanted = node_state_dir.resolve()
    found = []
    for p in psutil.process_iter(["cmdline"]):
        argv = p.info["cmdline"] or []
        if "node_actor.fork_server" in argv and "--directory" in argv[:-1]:
            if Path(argv[argv.index("--directory") + 1]).resolve() == wanted:
                found.append(p)
    return found


def _job_group(pid_file: Path) -> int | None:
    """The process group of the run whose job PID ``pid_file`` holds, while that process is
    still the run's (``live_pid``: ended runs leave their PID files, and PIDs are reused)."""
    from node_actor.launcher import live_pid

    pid = live_pid(pid_file)
    try:
        return os.getpgid(pid) if pid is not None else None
    except OSError:
        return None


def _running(process) -> bool:
    """Alive and not a zombie (a killed process its parent has not reaped yet)."""
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _in_group(pid: int, group: int) -> bool:
    try:
        return os.getpgid(pid) == group
    except OSError:
        return False


def _end_processes(procs: list, grace_s: float = 2.0) -> None:
    """SIGTERM, and SIGKILL what is left after ``grace_s`` (0: SIGKILL at once)."""
    import psutil

    alive = procs
    if grace_s > 0:
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


def wait_for_nodes(count: int, timeout_s: float = 60.0) -> None:
    """Wait (as a connected driver) until ``count`` Ray nodes are alive."""
    import ray

    deadline = time.time() + timeout_s
    while sum(1 for n in ray.nodes() if n["Alive"]) < count:
        if time.time() > deadline:
            raise LocalRayError(f"only {sum(1 for n in ray.nodes() if n['Alive'])} of {count} Ray nodes alive "
                                f"after {timeout_s:.0f} s")
        time.sleep(0.2)
