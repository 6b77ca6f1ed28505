"""One long-lived process per node that starts the node's jobs and records how each ended.

    python -m node_actor.fork_server --directory NODE_DIR     (started on demand: ``server_address``)

Why a server: a job used to be started through two fresh interpreters (an exit recorder, then
the job's first stage), ~0.25 s of CPU per job before any of the user's code ran. This process
imports our stages once and forks each job from itself (``node_actor.forking``): a few
milliseconds. It is also every job's exit recorder -- the jobs are its children -- so it writes
each job's PID file at the start and its exit file (``{"exit_code", "start_error"}``) at the end,
which is what the node actor reads (``launcher.read_outcome``); the Ray task that asked for the
start is told the exit code on its connection.

It lives in its own session, no child of a Ray worker: when Ray kills the node actor's worker
(and its children) the server and its jobs live on, and a restarted node actor re-adopts the
runs from their files. A job is started in a session of its own (a cancel signals its whole
group; the server shrugs off signals meant for jobs). It exits when asked (``quit``: once its
jobs are gone) or after ``IDLE_EXIT_S`` with no job and no connection; the next launch starts a
new one.

Who may ask it: it listens on an abstract Unix socket (no file that could be given looser
permissions, no path length limit) whose random name is in ``NODE_DIR/fork_server.json`` (0600
in a 0700 directory), and it serves only peers of its own OS user (``SO_PEERCRED``): another user
of the machine can neither find it nor talk to it (docs/security.md).

Protocol: one JSON object per line. ``{"op": "run", "argv", "env", "cwd", "log", "pid_file",
"exit_file"}`` -> ``{"pid": N}`` at once, then ``{"exit_code": C}`` when the job ended (or
``{"error": reason}``); ``{"op": "ping"}`` -> ``{"pid": server pid}``; ``{"op": "quit"}`` -> ``{}``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gc
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hier_sched.common.private_files import open_private, private_dir, replace_private, write_private
from hier_sched.core.failures import COMMAND_NOT_EXECUTABLE, cannot_start
from node_actor import forking

__all__ = ["ask", "server_address", "server_pid", "request", "quit_server", "IDLE_EXIT_S", "ADDRESS_FILE"]

ADDRESS_FILE = "fork_server.json"
IDLE_EXIT_S = 120.0
_START_TIMEOUT_S = 60.0
_IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
# Imported once here so that forked jobs need not: our stages and what they import.
_PRELOAD = ("node_actor.emulated_job", "node_actor.run_callable", "cloudpickle")


# ---------------------------------------------------------------------- the client side
def server_address(directory: str | Path) -> str:
    """The address of ``directory``'s server, started if none answers (one at a time: a lock)."""
    directory = private_dir(directory)
    address = _answering(directory)
    if address is not None:
        return address
    with open(open_private(directory / "fork_server.lock", os.O_RDWR), "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        address = _answering(directory)
        if address is not None:
            return address
        old = _read_address(directory)
        log = open_private(directory / "fork_server.log")
        try:  # the server detaches itself (forks, first process exits): no child of this process
            subprocess.run([sys.executable, "-m", "node_actor.fork_server", "--directory", str(directory)],
                           stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, check=True)
        finally:
            os.close(log)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            address = _read_address(directory)
            if address not in (None, old) and _ping(address):
                return address
            time.sleep(0.01)
    raise RuntimeError(f"the node's fork server did not start within {_START_TIMEOUT_S:.0f} s "
                       f"(see {directory / 'fork_server.log'})")


def ask(directory: str | Path, message: dict[str, Any], timeout: float | None = 10.0) -> "_Connection":
    """Send one request to ``directory``'s server, started if none answers. The last server's
    address is tried first, without a ping: a dead one refuses the connection at once."""
    address = _read_address(Path(directory))
    if address is not None:
        try:
            return request(address, message, timeout)
        except OSError:
            pass
    return request(server_address(directory), message, timeout)


def quit_server(directory: str | Path) -> None:
    """Ask ``directory``'s server, if one answers, to exit once its jobs are gone."""
    address = _answering(Path(directory))
    if address is not None:
        with request(address, {"op": "quit"}) as conn:
            conn.answer(timeout=5.0)


def request(address: str, message: dict[str, Any], timeout: float | None = 10.0) -> "_Connection":
    """Send one request; the connection yields the answers."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(_abstract(address))
        sock.sendall(json.dumps(message).encode() + b"\n")
    except BaseException:
        sock.close()
        raise
    return _Connection(sock)


class _Connection:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.reader = sock.makefile("rb")

    def answer(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next answer; None when the server closed the connection (it died)."""
        self.sock.settimeout(timeout)
        try:
            line = self.reader.readline()
        except OSError:
            return None
        return json.loads(line) if line else None

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def __enter__(self) -> "_Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _abstract(address: str) -> bytes:
    return b"\0" + address.encode()


def _read_address(directory: Path) -> str | None:
    return _read(directory, "address")


def server_pid(directory: str | Path) -> int | None:
    """The PID ``directory``'s last server wrote (it may have exited since)."""
    return _read(Path(directory), "pid")


def _read(directory: Path, key: str) -> Any:
    try:
        return json.loads((directory / ADDRESS_FILE).read_text())[key]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _ping(address: str) -> bool:
    try:
        with request(address, {"op": "ping"}, timeout=5.0) as conn:
            return conn.answer(timeout=5.0) is not None
    except OSError:
        return False


def _answering(directory: Path) -> str | None:
    address = _read_address(directory)
    return address if address is not None and _ping(address) else None


# ---------------------------------------------------------------------- the server
@dataclass
class _Job:
    conn: socket.socket | None  # the asker, told the exit code; None once it hung up
    exit_file: str
    errors: int  # read end of the child's start-error pipe (closed by a successful exec)


@dataclass
class _Client:
    sock: socket.socket
    buffer: bytes = b""
    pids: list[int] = field(default_factory=list)


def _await_own_group(pid: int) -> None:
    """Wait until the child ``pid`` runs in its own process group (its first step): only then is
    its PID told anyone, so that a cancel of "the job's group" cannot find the server's group --
    and a job still starting in it -- or no group at all."""
    while True:
        try:
            if os.getpgid(pid) == pid:
                return
        except ProcessLookupError:  # already gone (reaped later): nothing to wait for
            return
        os.sched_yield()


class _Server:
    def __init__(self, directory: Path):
        self.directory = directory
        self.address = f"hier_sched-fork-{uuid.uuid4().hex}"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(_abstract(self.address))
        self.listener.listen(256)
        self.listener.setblocking(False)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.clients: dict[socket.socket, _Client] = {}
        self.jobs: dict[int, _Job] = {}
        self.quitting = False
        self.idle_since = time.monotonic()

    def serve(self) -> None:
        for sig in _IGNORED:  # caught, not ignored: a child resets caught signals (forking.reset_child_state)
            signal.signal(sig, lambda *_: None)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        write_private(self.directory / ADDRESS_FILE, json.dumps({"address": self.address, "pid": os.getpid()}))
        while True:
            for key, _ in self.selector.select(timeout=1.0):
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                else:
                    self._read(self.clients[key.fileobj])  # type: ignore[index]
            self._reap()
            if self.jobs or self.clients:
                self.idle_since = time.monotonic()
            elif self.quitting or time.monotonic() - self.idle_since > IDLE_EXIT_S:
                return

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except BlockingIOError:
            return
        _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.getuid():  # only this user's processes may start jobs as this user
            sock.close()
            return
        sock.setblocking(False)
        self.clients[sock] = _Client(sock)
        self.selector.register(sock, selectors.EVENT_READ)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._hang_up(client)
            return
        client.buffer += data
        while b"\n" in client.buffer:
            line, client.buffer = client.buffer.split(b"\n", 1)
            self._handle(client, line)

    def _handle(self, client: _Client, line: bytes) -> None:
        try:
            message = json.loads(line)
            op = message["op"]
        except (ValueError, KeyError, TypeError):
            self._send(client.sock, {"error": "not a request"})
            return
        if op == "ping":
            self._send(client.sock, {"pid": os.getpid()})
        elif op == "quit":
            self.quitting = True
            self._send(client.sock, {})
        elif op == "run":
            self._start(client, message)
        else:
            self._send(client.sock, {"error": f"unknown op {op!r}"})

    def _start(self, client: _Client, message: dict[str, Any]) -> None:
        try:
            argv = [str(a) for a in message["argv"]]
            env = {str(k): str(v) for k, v in message["env"].items()}
            pid_file, exit_file = str(message["pid_file"]), str(message["exit_file"])
            if not argv:
                raise ValueError("empty argv")
            log_fd = open_private(message["log"])
        except (KeyError, TypeError, AttributeError, ValueError, OSError) as exc:
            self._send(client.sock, {"error": f"bad run request: {type(exc).__name__}: {exc}"})
            return
        errors_r, errors_w = os.pipe2(os.O_CLOEXEC)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        # Signals meant for the job are held until it has dropped the server's handlers, which
        # would swallow them: a cancel sent right after the start must still end the job.
        signal.pthread_sigmask(signal.SIG_BLOCK, _IGNORED)
        pid = os.fork()
        if pid == 0:
            self._become_job(argv, env, message.get("cwd"), log_fd, errors_w)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _IGNORED)
        os.close(log_fd)
        os.close(errors_w)
        _await_own_group(pid)
        write_private(pid_file, str(pid))
        self.jobs[pid] = _Job(client.sock, exit_file, errors_r)
        client.pids.append(pid)
        self._send(client.sock, {"pid": pid})

    def _become_job(self, argv: list[str], env: dict[str, str], cwd: str | None, log_fd: int, errors_w: int) -> None:
        """In the child: leave the server behind, then run the job (never returns)."""
        try:
            os.setsid()  # the job's own session and process group: a cancel reaches its whole tree
            forking.reset_child_state()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _IGNORED)
            self.selector.close()
            for sock in (self.listener, *self.clients):
                sock.close()
            for fd in (self.wake_r, self.wake_w, *(job.errors for job in self.jobs.values())):
                os.close(fd)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.close(null)
            os.close(log_fd)
            os.environ.clear()
            os.environ.update(env)
            try:
                if cwd:
                    os.chdir(cwd)
            except OSError as exc:
                self._start_failed(errors_w, f"cannot start working directory {cwd!r}: {exc.strerror or exc}",
                                   COMMAND_NOT_EXECUTABLE)
            if forking.runs_in_process(argv):
                os.close(errors_w)
                forking.run_module_and_exit(argv)
            try:
                os.execvpe(argv[0], argv, env)
            except OSError as exc:
                code, reason = cannot_start(argv[0], exc)
                self._start_failed(errors_w, reason, code)
        finally:
            os._exit(COMMAND_NOT_EXECUTABLE)  # only reached when something above raised unexpectedly

    @staticmethod
    def _start_failed(errors_w: int, reason: str, code: int) -> None:
        os.write(2, f"hier_sched: {reason}\n".encode())
        os.write(errors_w, reason.encode())
        os._exit(code)

    def _reap(self) -> None:
        while self.jobs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.jobs.pop(pid, None)
            if job is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            os.set_blocking(job.errors, False)
            try:
                start_error = os.read(job.errors, 4096).decode("utf-8", "replace")
            except BlockingIOError:
                start_error = ""
            os.close(job.errors)
            # whole or absent (renamed into place); not synced: a machine that crashes takes its jobs along
            replace_private(job.exit_file, json.dumps({"exit_code": code, "start_error": start_error}))
            if job.conn is not None:
                self._send(job.conn, {"exit_code": code})

    def _hang_up(self, client: _Client) -> None:
        self.selector.unregister(client.sock)
        del self.clients[client.sock]
        client.sock.close()
        for pid in client.pids:  # its jobs still run; their ends go to their exit files only
            if pid in self.jobs:
                self.jobs[pid].conn = None

    @staticmethod
    def _send(sock: socket.socket, message: dict[str, Any]) -> None:
        try:
            sock.setblocking(True)
            sock.sendall(json.dumps(message).encode() + b"\n")
            sock.setblocking(False)
        except OSError:
            pass  # the asker is gone; the job's files still say everything


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m node_actor.fork_server")
    p.add_argument("--directory", required=True, help="the node's state directory (holds fork_server.json)")
    args = p.parse_args(argv)
    if os.fork() > 0:  # detach: the server must be no child of the (Ray worker) process that asked for it
        return 0
    for module in _PRELOAD:
        __import__(module)
    gc.freeze()  # what is loaded now is never collected: a forked job's collector leaves those pages shared
    _Server(private_dir(args.directory)).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
