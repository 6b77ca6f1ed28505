"""The long-lived tracing worker: where every trace runs, whatever the caller's process has done.

Why a separate process, started fresh (not forked from the caller):
- Under a CUDA build of torch (what GPU users install), a process that has run a backward pass
  has started autograd's device threads, and a child forked from it cannot run autograd at all
  ("Unable to handle autograd's threading in combination with fork-based multiprocessing"). The
  caller may be a scheduler, a notebook or a training script: we cannot know what it ran.
- Fake tensors can abort a process (pytorch#92627) and user models can hang: each trace runs in a
  child the worker forks, under a timeout, so neither takes the caller (or the worker) down.

The worker is a *zygote*: it starts once per caller process (``python -m estimators.trace_worker``,
a fresh interpreter, so nothing of the caller's ``__main__`` is re-run), pays the seconds of lazy
initialisation of fake tensors and optimizers once, with a forward pass and an optimizer step but
no backward (so its forked children can still run autograd), then forks one child per trace. The
model travels as a cloudpickle payload (lambdas and local factories included); the worker
unpickles it once itself before forking, so the libraries it imports (timm, transformers) are
loaded once and inherited by every later child.

Protocol, over a socket pair (stdout stays free for whatever user code prints): the worker sends
``READY``; then for each request (pickled ``dict(payload=bytes, timeout_s=float)``) one reply
(pickled ``(status, value)``: ``("ok", result)`` or ``("error", reason)``).

Code of unknown behaviour (a job's model factory, estimated where the job's code lives:
``estimators.job_estimate``) runs under ``worker_limits``: its requests are not preloaded into the
worker (an import that hangs or fills the memory stays in the child, which the timeout kills),
and the child caps its own address space before it unpickles anything, so the user's import
runs under the host-memory budget too. Children die with the worker, and the worker stops a
child as soon as its caller is gone (a cancelled estimate task takes its trace with it).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any, Callable

__all__ = ["WorkerFailed", "call_in_worker", "payload_of", "shutdown_worker", "worker_limits", "budget_reason",
           "START_TIMEOUT_S"]

READY = b"READY"
# Starting the worker: a fresh interpreter imports torch and warms fake tensors up (2-4 s idle,
# up to ~20 s under load on a 2-core box); beyond this something is wrong with the environment.
START_TIMEOUT_S = 120.0
# How long the worker may take beyond a trace's own timeout to answer (kill the child, reply).
_REPLY_SLACK_S = 10.0
_STDERR_TAIL = 2000
_PRELOAD_MAX_BYTES = 16 * 2**20


class WorkerFailed(RuntimeError):
    """The worker could not run a request (start-up failure, death, no reply); the text says why."""


# --- caller side ------------------------------------------------------------------------------

class _Worker:
    def __init__(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        self.stderr = tempfile.TemporaryFile()
        env = dict(os.environ)
        # The caller's import path, so the worker imports this same checkout and every module a
        # by-reference pickle names (a test module, ``examples.hf_models``, the user's package).
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        # Traces run on CPU fakes: the worker never needs a GPU, and on a machine with one, any CUDA
        # call in the zygote (``torch.cuda.is_available()`` initialises the driver) makes every
        # forked child's CUDA call fail with "CUDA error: initialization error" (seen on an H100)
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        self.proc = subprocess.Popen([sys.executable, "-m", "estimators.trace_worker", str(child_sock.fileno())],
                                     pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.stderr, env=env, close_fds=True)
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.owner_pid = os.getpid()
        self._expect(START_TIMEOUT_S, "start")

    def _expect(self, timeout_s: float, what: str) -> bytes:
        try:
            if self.conn.poll(timeout_s):
                return self.conn.recv_bytes()
        except (EOFError, OSError):
            pass
        self.kill()
        raise WorkerFailed(f"tracing worker {'did not ' + what if what == 'start' else 'gave no reply'}"
                           f"{self._death_note()}")

    def _death_note(self) -> str:
        code = self.proc.poll()
        self.stderr.seek(0)
        tail = self.stderr.read().decode(errors="replace").strip()[-_STDERR_TAIL:]
        state = "still running" if code is None else f"exit code {code}"
        return f" ({state}){': ' + tail.splitlines()[-1] if tail else ''}"

    def request(self, payload: bytes, timeout_s: float) -> tuple[str, Any]:
        try:
            self.conn.send_bytes(pickle.dumps({"payload": payload, "timeout_s": timeout_s,
                                               "sys_path": [p or os.getcwd() for p in sys.path], **_limits}))
        except OSError:
            self.kill()
            raise WorkerFailed(f"tracing worker is gone{self._death_note()}") from None
        return pickle.loads(self._expect(timeout_s + _REPLY_SLACK_S, "reply"))

    def alive(self) -> bool:
        return self.proc.poll() is None and self.owner_pid == os.getpid()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)
        self.conn.close()


_lock = threading.Lock()
_worker: _Worker | None = None
_limits: dict[str, Any] = {}  # what ``worker_limits`` adds to every request


@contextlib.contextmanager
def worker_limits(*, host_budget_bytes: int, preload: bool = False) -> Iterator[None]:
    """Requests this process sends inside run their child under an address-space cap of what it
    maps plus ``host_budget_bytes`` (set before the payload is unpickled: imports count), and are
    not preloaded into the worker unless ``preload``. For code whose behaviour is unknown. The
    setting is the process's (an estimate task runs one estimate at a time), not a thread's."""
    _limits.update(host_budget_bytes=int(host_budget_bytes), preload=preload)
    try:
        yield
    finally:
        _limits.clear()


def budget_reason(host_budget_bytes: int) -> str:
    """How a child that ran out of its host-memory budget is reported."""
    return f"needs more than the host-memory budget ({host_budget_bytes / 2**20:.0f} MiB)"


def call_in_worker(payload: bytes, timeout_s: float) -> tuple[str, Any]:
    """Send one trace request (a cloudpickle payload of ``(function, args)``) to the worker, starting
    or restarting it when needed; ``(status, value)`` as the child reported it. Raises
    ``WorkerFailed`` when the worker itself failed (it is restarted on the next call)."""
    global _worker
    with _lock:  # one trace at a time: a trace uses a core, and the machine may have two
        if _worker is None or not _worker.alive():
            # A worker inherited through a fork of the caller belongs to the parent: start our own.
            _worker = _Worker()
        worker = _worker
        try:
            return worker.request(payload, timeout_s)
        except WorkerFailed:
            _worker = None
            raise


def shutdown_worker() -> None:
    """Stop the worker (it also stops by itself when the caller exits and its socket closes)."""
    global _worker
    with _lock:
        if _worker is not None and _worker.owner_pid == os.getpid():
            _worker.kill()
        _worker = None


atexit.register(shutdown_worker)


# --- worker side ------------------------------------------------------------------------------

def _warm_up() -> None:
    """A fake-tensor forward and an Adam step on fake gradients, no backward: the first trace in
    a process otherwise pays seconds of lazy initialisation (fake-tensor and decomposition
    registrations, optimizer imports), and a backward here would start the autograd threads
    that forked children cannot use."""
    import torch
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                              nn.Linear(4, 2))
        with torch.no_grad():
            out = model(torch.randn(2, 3, 8, 8))
        nn.functional.cross_entropy(out, torch.tensor([0, 1]))
        params = list(model.parameters())
        for p in params:
            p.grad = torch.zeros_like(p)
        for opt in (torch.optim.Adam(params, foreach=True), torch.optim.SGD(params, lr=0.1, momentum=0.9,
                                                                            foreach=True)):
            opt.step()


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (elsewhere: nothing to do)."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _cap_address_space(budget_bytes: int) -> None:
    """What the child maps now plus ``budget_bytes``, as both limits: nothing later may raise it."""
    import resource

    import psutil

    limit = psutil.Process().memory_info().vms + budget_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _run_child(request: dict, out_fd: int) -> None:
    """In the forked child: unpickle, run the function (it returns the ``(status, value)`` reply
    itself and reports its own failures), write the pickled reply."""
    import cloudpickle

    budget = request.get("host_budget_bytes")
    try:
        if budget:
            _cap_address_space(budget)
        function, args = cloudpickle.loads(request["payload"])
    except BaseException as exc:  # noqa: BLE001
        what = budget_reason(budget) if budget and isinstance(exc, MemoryError) else \
            f"{type(exc).__name__}: {str(exc)[:300]}"
        reply: tuple[str, Any] = ("error", f"the model could not be loaded in the tracing worker: {what}")
    else:
        reply = function(*args)
    try:
        data = pickle.dumps(reply)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result is a bug to report, not to hide
        data = pickle.dumps(("error", f"result could not be sent back: {type(exc).__name__}: {exc}"))
    with os.fdopen(out_fd, "wb") as fh:
        fh.write(data)


class _CallerGone(Exception):
    """The caller closed its end while a child ran: nobody waits for the answer."""


def _fork_and_wait(request: dict, caller: Connection) -> tuple[str, Any]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the worker's loop
        status = 0
        try:
            os.close(read_fd)
            _die_with_parent()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _run_child(request, write_fd)
        except BaseException:  # noqa: BLE001
            status = 1
        finally:
            os._exit(status)
    os.close(write_fd)
    deadline = time.monotonic() + float(request["timeout_s"])
    chunks: list[bytes] = []
    timed_out = False
    with os.fdopen(read_fd, "rb", buffering=0) as fh:
        while True:
            left = deadline - time.monotonic()
            ready = select.select([fh, caller], [], [], max(left, 0))[0] if left > 0 else []
            if caller in ready and fh not in ready:  # one request at a time: a readable caller has hung up
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise _CallerGone
            if not ready:
                timed_out = True
                break
            chunk = fh.read(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return "error", f"timeout after {float(request['timeout_s']):.0f} s"
    if not chunks:
        how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exit code {os.waitstatus_to_exitcode(status)}")
        return "error", f"tracer process died ({how})"
    return pickle.loads(b"".join(chunks))


def _preload(payload: bytes) -> None:
    """Unpickle a request once in the worker, so the modules it names are imported here and every
    later child inherits them. Failures are the child's to report. A large payload carries a
    model object with its weights: unpickling it twice would cost memory for nothing, so the child
    does its own imports then."""
    import cloudpickle

    if len(payload) > _PRELOAD_MAX_BYTES:
        return
    try:
        cloudpickle.loads(payload)
    except BaseException:  # noqa: BLE001
        pass


def main(fd: int) -> None:
    conn = Connection(fd)
    _warm_up()
    conn.send_bytes(READY)
    while True:
        try:
            request = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the caller is gone
        # Directories the caller added to its import path since the worker started (a user script's
        # own folder, a plug-in directory): a factory pickled by reference is imported from there.
        sys.path.extend(p for p in request.get("sys_path", ()) if p not in sys.path)
        if request.get("preload", True):
            _preload(request["payload"])
        try:
            reply = _fork_and_wait(request, conn)
        except _CallerGone:
            return
        except BaseException as exc:  # noqa: BLE001 - the worker must answer every request
            reply = ("error", f"tracing worker failed: {type(exc).__name__}: {exc}")
        try:
            conn.send_bytes(pickle.dumps(reply))
        except OSError:
            return


def payload_of(function: Callable[..., tuple[str, Any]], *args: Any) -> bytes:
    """The payload for ``call_in_worker``: ``function(*args)``, pickled by cloudpickle; the
    function returns ``("ok", value)`` or ``("error", reason)``."""
    import cloudpickle

    return cloudpickle.dumps((function, args))


if __name__ == "__main__":
    main(int(sys.argv[1]))
