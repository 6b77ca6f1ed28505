"""Why a job's process ended badly: GPU out-of-memory, a checkpoint-and-requeue request, an
external kill, or any other error.

The distinction drives recovery: only a GPU OOM is retried with a larger memory margin
(FIELD_NOTES §1, thesis Ch. 7.2); a checkpointed job is simply requeued; a killed or crashed job
follows the separate non-OOM retry rule. The thesis system treated *any* non-zero exit as an OOM
crash and grepped for bare keywords (``unsuccessful``, ``OOM``, ``Non-OK-status``); we do not
copy that: every OOM marker below is specific to GPU memory, and the thesis' generic words count
only when the same line also speaks of memory.

Pure: the caller (the node actor) reads the exit status and the tail of the job's log and
passes them in. Host-RAM exhaustion (Python ``MemoryError``, the kernel OOM killer's SIGKILL) is
deliberately *not* ``oom``: a bigger GPU-memory margin would not help it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from signal import Signals
from typing import Literal

from hier_sched.core.wire import pickled_by_fields

__all__ = ["REQUEUE_EXIT_CODE", "COMMAND_NOT_EXECUTABLE", "COMMAND_NOT_FOUND", "Failure", "FailureKind",
           "classify_failure", "cannot_start"]

# Exit code by which a job says "I saved a checkpoint, requeue me" (the answer to the checkpoint
# signal). 85 is outside the ranges with a conventional meaning (1-2 generic errors, 126-127
# shell exec failures, 128+N death by signal N), so no ordinary failure produces it by accident.
REQUEUE_EXIT_CODE = 85
# The shell's exit codes for a command that could not be started (the job's stages use them too).
COMMAND_NOT_EXECUTABLE, COMMAND_NOT_FOUND = 126, 127

# start_error: never ran; lost: its node (the machine, or its Ray node) died under it -- nothing the job did
FailureKind = Literal["oom", "checkpoint_requeue", "killed", "error", "start_error", "lost"]

_MAX_QUOTE_CHARS = 200

# Each marker names GPU memory exhaustion unambiguously, in the wording of the library that
# prints it. Matched line by line against the log tail.
_OOM_MARKERS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"torch\.(?:cuda\.)?OutOfMemoryError",  # PyTorch >= 1.13 exception type (CUDA and HIP)
        r"CUDA out of memory",  # PyTorch's message text (older versions: RuntimeError)
        r"CUDA_ERROR_OUT_OF_MEMORY",  # CUDA driver API, e.g. TensorFlow's allocator log
        r"cudaErrorMemoryAllocation",  # CUDA runtime API error name
        r"CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS could not allocate its workspace
        r"CUDNN_STATUS_ALLOC_FAILED",  # cuDNN, same
        # CUDA runtime's own text: "CUDA error: out of memory", "cuda runtime error (2) : out of
        # memory". A bare "out of memory" is not enough: DataLoader workers and the kernel say
        # it about host RAM.
        r"(?i:cuda|gpu|device)[^\n]{0,40}\bout of memory\b",
        # TensorFlow / XLA / JAX: "ResourceExhaustedError: OOM when allocating tensor",
        # "RESOURCE_EXHAUSTED: Out of memory while trying to allocate". gRPC (which Ray uses)
        # also says RESOURCE_EXHAUSTED, e.g. for an oversized message; that line names no memory.
        r"(?:RESOURCE_EXHAUSTED|ResourceExhaustedError|Resource exhausted)"
        r"[^\n]*(?:\bOOM\b|(?i:out of memory|allocat))",
        # The thesis' keywords, only in an OOM context on the same line.
        r"\bOOM\b(?![- ]?killer)",  # as a whole word; the host's "OOM killer" is not a GPU OOM
        r"Non-OK-status[^\n]*(?i:out of memory|\bOOM\b|RESOURCE_EXHAUSTED)",
        r"(?i:unsuccessful)[^\n]*(?i:memory)|(?i:memory)[^\n]*(?i:unsuccessful)",
    )
)

# Signals by which a process crashes by itself (a bug), as opposed to being stopped from outside.
_CRASH_SIGNALS = frozenset(
    {Signals.SIGSEGV, Signals.SIGABRT, Signals.SIGBUS, Signals.SIGFPE, Signals.SIGILL}
)

# A Python traceback's final line, e.g. "FileNotFoundError: [Errno 2] No such file ...".
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit)\b.*")
# What a native crash prints before its signal: C++'s std::terminate, an uncaught C++ exception's
# message, CPython's fatal error (a library thread outliving the interpreter, say).
_NATIVE_CRASH_LINE = re.compile(r"^(?:terminate called\b.*|what\(\): .*|Fatal Python error: .*)")

_SHELL_EXIT_MEANINGS = {COMMAND_NOT_EXECUTABLE: "command not executable", COMMAND_NOT_FOUND: "command not found"}


@pickled_by_fields  # read on every tick (core.wire)
@dataclass(frozen=True, slots=True)
class Failure:
    """How a job's process failed; ``reason`` is one line meant for ``hier-sched status``."""

    kind: FailureKind
    reason: str
    exit_code: int | None = None
    signal: int | None = None


def classify_failure(
    exit_code: int | None, log_tail: str, *, signal: int | None = None
) -> Failure | None:
    """Classify how a job's process ended; ``None`` means it succeeded (exit 0, no signal).

    ``exit_code`` is the process' exit status; a negative value (``subprocess`` reporting death
    by a signal) and shell-style ``128 + N`` are read as signal N when ``signal`` is not given.
    ``log_tail`` is the end of the job's combined stdout/stderr (a few hundred lines suffice).

    Precedence: the requeue code (the job's explicit request) first, then a GPU-OOM marker in
    the log (the root cause even if the process was later killed or aborted, e.g. TensorFlow's
    ``Non-OK-status`` check aborts with SIGABRT), then the signal, then a generic error.
    """
    if exit_code is None and signal is None:
        raise ValueError("classify_failure needs an exit code or a signal: the process has not ended")
    if exit_code == 0 and signal is None:
        return None
    if exit_code == REQUEUE_EXIT_CODE and signal is None:
        return Failure(
            "checkpoint_requeue",
            f"exit code {REQUEUE_EXIT_CODE}: checkpoint saved, the job asks to be requeued",
            exit_code,
        )
    signal = signal if signal is not None else _signal_from_exit_code(exit_code)

    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    oom_line = _last_matching_line(lines)
    if oom_line is not None:
        return Failure("oom", f"GPU out of memory: {_quote(oom_line)}", exit_code, signal)
    if signal is not None:
        return _signal_failure(signal, exit_code, lines)
    return Failure("error", _error_reason(exit_code, lines), exit_code, signal)


def _signal_from_exit_code(exit_code: int | None) -> int | None:
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    if exit_code > 128 and _signal_name(exit_code - 128) is not None:
        return exit_code - 128
    return None


def _signal_name(number: int) -> str | None:
    try:
        return Signals(number).name
    except ValueError:
        return None


def _signal_failure(signal: int, exit_code: int | None, lines: list[str]) -> Failure:
    name = _signal_name(signal) or f"signal {signal}"
    if signal in _CRASH_SIGNALS:
        detail = _last_line(lines, _EXCEPTION_LINE) or _last_line(lines, _NATIVE_CRASH_LINE)
        reason = f"crashed with {name}" + (f": {_quote(detail)}" if detail else "")
        return Failure("error", reason, exit_code, signal)
    return Failure("killed", f"killed by {name}", exit_code, signal)


def _error_reason(exit_code: int | None, lines: list[str]) -> str:
    meaning = _SHELL_EXIT_MEANINGS.get(exit_code) if exit_code is not None else None
    head = f"exit code {exit_code}" + (f" ({meaning})" if meaning else "")
    detail = _last_line(lines, _EXCEPTION_LINE) or (lines[-1] if lines else None)
    return f"{head}: {_quote(detail)}" if detail else f"{head}, no output"


def _last_matching_line(lines: list[str]) -> str | None:
    for line in reversed(lines):
        if any(marker.search(line) for marker in _OOM_MARKERS):
            return line
    return None


def _last_line(lines: list[str], pattern: re.Pattern[str]) -> str | None:
    return next((line for line in reversed(lines) if pattern.match(line)), None)


def _quote(text: str) -> str:
    return text if len(text) <= _MAX_QUOTE_CHARS else text[: _MAX_QUOTE_CHARS - 3] + "..."


def cannot_start(command: str, exc: OSError) -> tuple[int, str]:
    """A command that could not be started: the shell's exit code for it and the words."""
    code = COMMAND_NOT_FOUND if isinstance(exc, FileNotFoundError) else COMMAND_NOT_EXECUTABLE
    return code, f"cannot start command {command!r}: {exc.strerror or exc}"
