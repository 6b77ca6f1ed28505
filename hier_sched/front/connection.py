"""How clients reach the scheduler: as Ray drivers, by the global queue's Ray name.

The ``GlobalQueue`` is a named detached actor (``hier_sched:global`` in namespace
``hier_sched``), so any process on any node of the cluster reaches it by name once it is a
Ray driver; nothing of ours has to run beside Ray. The cluster is found the way Ray drivers
find it, in this order:

1. the Ray connection this process already has (inside a Ray job or task, after ``ray.init``);
2. ``RAY_ADDRESS``;
3. the address a ``hier-sched up`` on this machine recorded (``cluster_record``), when a Ray
   cluster still answers there — before "auto" because on a machine with several Ray clusters
   "auto" takes the last ``ray start --head`` (or any one found), while the record names the
   cluster this user's ``up`` started;
4. ``address="auto"``: a Ray cluster running on this node.

One connection per process (the CLI makes one per command). A command of ours (``status``,
``submit``, ``up``...) connects as a driver in ``COMMAND_NAMESPACE``, whose ``_ray_internal_``
prefix keeps it off the dashboard's Jobs page and ``ray list jobs``, as Ray's own internal
drivers are; its job's metadata names the command. A user's program (``hs.submit`` in a
script, ``hier-sched run`` as a Ray job's entrypoint) stays a visible driver: it is theirs. There is no second, faster path
beside this one: connecting costs about a second here (BENCHMARKS.md, "Control plane"), and a
side channel would be a second way to the queue to keep in step — and a process whose death
cuts clients off, which is what this design removes.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hier_sched.common.actor_names import GLOBAL_NAME, NAMESPACE
from hier_sched.front.cluster_record import read_record, record_file

__all__ = ["SchedulerUnavailable", "Scheduler", "connect", "connect_ray", "disconnect", "gcs_answers",
           "COMMAND_NAMESPACE"]

# Ray leaves drivers whose namespace starts with its internal prefix off the Jobs page and its
# job listings (ray._raylet.RAY_INTERNAL_NAMESPACE_PREFIX; a test pins it to the installed Ray)
COMMAND_NAMESPACE = "_ray_internal_hier_sched"

_CONNECT_CHECK_S = 3.0
_READS = frozenset({"status", "states", "history", "result", "read_log", "cluster", "settings"})  # safe to ask twice
_RESTART_WAIT_S = 60.0  # how long a read waits for a restarting global queue
_HOW_TO_POINT = ("set RAY_ADDRESS=HOST:PORT (the head's address that `ray start --head` printed), run on a node "
                 "of the cluster, or start a local cluster with `hier-sched up`")


class SchedulerUnavailable(RuntimeError):
    """No Ray cluster found, no scheduler on it, or the scheduler did not answer."""


@dataclass(frozen=True, slots=True)
class Scheduler:
    """The global queue's handle, with where it was found (for messages)."""

    handle: Any
    address: str
    found_by: str

    def call(self, method: str, *args: Any, timeout: float = 120.0) -> Any:
        """``GlobalQueue.<method>(*args)``, waited for. A read that meets the queue restarting
        is asked again until it is back (``_RESTART_WAIT_S``); anything else is asked once.
        Submissions go through ``submit``, which makes asking again safe."""
        if method in ("submit", "submit_many"):
            raise ValueError(f"{method} through Scheduler.{method}: it gives the call its request ids")
        return self._call(method, args, timeout, retry=method in _READS)

    def call_whole(self, method: str, *args: Any, patience_s: float | None = None, timeout: float = 120.0) -> Any:
        """``call``, asked again while its answer names nodes that did not answer (``waiting_on``:
        a node busy with a tick's exchange answers a moment later), for up to ``patience_s``
        (``NODE_PATIENCE_S``); the last answer, whole or not (``waiting_on`` then names what is missing)."""
        give_up = time.monotonic() + (NODE_PATIENCE_S if patience_s is None else patience_s)
        while True:
            answer = self.call(method, *args, timeout=timeout)
            if not (isinstance(answer, dict) and answer.get("waiting_on")) or time.monotonic() >= give_up:
                return answer
            time.sleep(0.2)

    def submit(self, spec: dict[str, Any], payload: bytes | None = None, estimate: dict[str, Any] | None = None,
               *, request_id: str | None = None, timeout: float = 120.0) -> dict[str, Any]:
        """Queue one job, exactly once: the call carries a request id (a fresh one unless the caller,
        who retries beyond this call's own wait, keeps its own), so whether Ray replays it on a
        restarted queue (the actor's ``max_task_retries``) or this client asks again after meeting a
        restart, every answer names the job the first arrival made."""
        request_id = request_id or uuid.uuid4().hex
        return self._call("submit", (spec, payload, request_id, estimate), timeout, retry=True)

    def submit_many(self, specs: list[dict[str, Any]], payloads: list[bytes | None] | None = None,
                    estimates: list[dict[str, Any] | None] | None = None, *,
                    timeout: float = 120.0) -> list[dict[str, Any]]:
        """Queue several jobs in one call and one durable write, each exactly once: every job carries
        a fresh request id of its own, so a call asked again (or replayed by Ray) answers with the
        jobs the first arrival made. Each answer as ``submit``'s, in order."""
        request_ids = [uuid.uuid4().hex for _ in specs]
        return self._call("submit_many", (specs, payloads, request_ids, estimates), timeout, retry=True)

    def _call(self, method: str, args: tuple[Any, ...], timeout: float, *, retry: bool) -> Any:
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        restart_deadline = time.monotonic() + _RESTART_WAIT_S
        while True:
            try:
                return ray.get(getattr(self.handle, method).remote(*args), timeout=timeout)
            except ActorUnavailableError as exc:
                if retry and time.monotonic() < restart_deadline:
                    time.sleep(0.5)
                    continue
                raise self._unavailable(method, exc) from None
            except RayActorError as exc:
                raise self._unavailable(method, exc) from None
            except GetTimeoutError:
                raise SchedulerUnavailable(f"the scheduler on the Ray cluster at {self.address} did not answer "
                                           f"`{method}` within {timeout:.0f} s") from None

    def _unavailable(self, method: str, exc: Exception) -> SchedulerUnavailable:
        first = (str(exc).strip().splitlines() or [""])[0]
        return SchedulerUnavailable(f"the scheduler on the Ray cluster at {self.address} did not answer `{method}` "
                                    f"({type(exc).__name__}: {first[:200]})")


NODE_PATIENCE_S = 30.0  # how long a read that needs every node's part asks again before it answers without one

_scheduler: Scheduler | None = None
_address: tuple[str, str] | None = None  # (address, found_by) of the ray.init this module made


def connect(directory: Path | None = None, *, command: str | None = None) -> Scheduler:
    """The scheduler of the Ray cluster this process finds (module docstring); cached.
    ``command``: this process is that command of ours, not a user's program (module docstring)."""
    global _scheduler
    if _scheduler is None:
        address, found_by = _find_ray(directory, command)
        _scheduler = Scheduler(_global_queue(address, found_by), address, found_by)
    return _scheduler


def connect_ray(address: str, found_by: str, command: str) -> str:
    """Make this process a driver of the Ray cluster at ``address`` for our ``command`` (what
    ``up`` and ``down`` do: they name their cluster); returns its GCS address."""
    import ray

    if ray.is_initialized():
        if _address is not None and _address[0] == address:
            return _current_address()
        disconnect(force=True)
    _init(address, found_by, command)
    return _current_address()


def disconnect(*, force: bool = False) -> None:
    """Drop the cached scheduler; end the Ray connection if this module made it (or ``force``)."""
    import ray

    global _scheduler, _address
    _scheduler = None
    if (_address is not None or force) and ray.is_initialized():
        ray.shutdown()
    _address = None


def gcs_answers(address: str, timeout_s: float = _CONNECT_CHECK_S) -> bool:
    """Whether something listens at ``host:port`` (a Ray head's GCS port, if anything)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def _find_ray(directory: Path | None, command: str | None) -> tuple[str, str]:
    import ray

    if ray.is_initialized():
        return _current_address(), "this process's Ray connection"
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env:
        found_by = "from RAY_ADDRESS"
        if "://" not in env and not gcs_answers(env):
            raise SchedulerUnavailable(f"no Ray cluster answers at {env} ({found_by}); is it running? "
                                       "Point RAY_ADDRESS at the head's HOST:PORT that `ray start --head` printed")
        _init(env, found_by, command)
        return env, found_by
    record = read_record(directory)
    if record is not None and gcs_answers(record.address):
        found_by = f"recorded by `hier-sched up` in {record_file(directory)}"
        _init(record.address, found_by, command)
        return record.address, found_by
    _init("auto", 'address="auto": a Ray cluster on this node', command)
    return _current_address(), "found on this node"


def _init(address: str, found_by: str, command: str | None) -> None:
    import ray
    from ray.job_config import JobConfig

    global _address
    named = {} if command is None else {"namespace": COMMAND_NAMESPACE,
                                        "job_config": JobConfig(metadata={"hier_sched": "command", "command": command})}
    try:
        ray.init(address=address, **{"namespace": NAMESPACE, **named}, log_to_driver=False,
                 logging_level=logging.WARNING)
    except ConnectionError as exc:
        if address == "auto":
            raise SchedulerUnavailable(f"no Ray cluster found on this node: {_HOW_TO_POINT}") from None
        raise SchedulerUnavailable(f"cannot connect to the Ray cluster at {address} ({found_by}): {exc}") from None
    except Exception as exc:  # noqa: BLE001 - e.g. a version mismatch: said once, clearly
        raise SchedulerUnavailable(f"cannot connect to the Ray cluster at {address} ({found_by}): "
                                   f"{type(exc).__name__}: {str(exc).strip()[:300]}") from None
    _address = (address, found_by)


def _current_address() -> str:
    import ray

    return ray.get_runtime_context().gcs_address


def _global_queue(address: str, found_by: str) -> Any:
    import ray

    try:
        return ray.get_actor(GLOBAL_NAME, namespace=NAMESPACE)
    except ValueError:
        raise SchedulerUnavailable(
            f"the Ray cluster at {address} ({found_by}) runs no hier_sched scheduler (no actor {GLOBAL_NAME!r} in "
            f"namespace {NAMESPACE!r}); start one on it with `hier-sched up --address {address}`") from None
