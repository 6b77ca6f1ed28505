"""A write-ahead log: records are durable on disk before ``append`` returns.

One directory belongs to one log (it is made private: 0700, every file 0600)::

    lock                      held with ``fcntl.flock`` while a writer has the log open
    snapshot                  the latest ``compact()`` value and the last sequence number it covers
    log-<first seq>.wal       segments of records; only the newest one is written

Every file starts with a 12-byte header: ``MAGIC`` and the format version (big-endian u32).
A record is framed as ``length (u32) | crc32 (u32) | msgpack [seq, record]``, the CRC taken over
the length bytes and the payload, so a damaged length is caught like a damaged payload. CRC-32
(``zlib.crc32``) because it ships with Python, runs at memory speed, and catches what a crash or
a bad sector does to a file (torn writes, zeroed blocks, flipped bits) — it is not a defence
against someone who can write to the directory, and needs not be: they own the queue anyway.

Sequence numbers start at 1 and grow by one per record, without gaps. A snapshot says which
number it covers, so replay is "the snapshot, then every record after it" whatever step of a
compaction a crash interrupted: records the snapshot already covers are skipped, never applied
twice, and segments are deleted only after the snapshot and the next segment are on disk.

Damage. A crash can only tear what was being written when it struck: the end of the newest
segment, never an acknowledged record (``append`` returns after ``fdatasync``). So the first bad
frame of the newest segment ends the log (point-in-time recovery): replay stops at the last good
record, the rest is copied aside to ``<segment>.damaged-<offset>`` and cut off, and
``Recovered.damage`` says where and why. Valid-looking records after a bad one are not replayed
either: a crash can land the blocks of one group write out of order, and applying events past a
hole would build a state that never existed. Anything else — a damaged older segment, a damaged
snapshot, a gap in the sequence — cannot come from a crash, and opening refuses with
``WalCorruptError`` rather than start from a partial queue. A file from a newer format version
is refused with ``WalVersionError`` before anything is read or changed.

One writer at a time: a second ``open`` of the same directory, in any process, gets
``WalLockedError``. The lock is ``flock``: keep the directory on a local disk (or a file system
whose ``flock`` and ``fsync`` are real).
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from hier_sched.common.private_files import private_dir

__all__ = ["WriteAheadLog", "Recovered", "Snapshot", "Damage", "WalError", "WalFormatError",
           "WalVersionError", "WalCorruptError", "WalLockedError", "MAGIC", "FORMAT_VERSION"]

MAGIC = b"HSCHDWAL"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">8sI")
_FRAME = struct.Struct(">II")  # payload length, crc32(length bytes + payload)
_SEGMENT = re.compile(r"log-(\d{20})\.wal")
_SNAPSHOT, _SNAPSHOT_TMP, _LOCK = "snapshot", "snapshot.tmp", "lock"
# strict_map_key guards against hash flooding from untrusted input; these files are private
# and must read back whatever ``append`` accepted (integer keys included).
_UNPACK = {"raw": False, "strict_map_key": False}


class WalError(Exception):
    """Base of every error this module raises on purpose."""


class WalFormatError(WalError):
    """A file in the log directory is not a hier_sched write-ahead log file."""


class WalVersionError(WalError):
    """A file was written in a format version this code cannot read (usually a newer one)."""

    def __init__(self, path: Path, found: int):
        self.path, self.found, self.supported = path, found, FORMAT_VERSION
        who = "written by a newer hier_sched" if found > FORMAT_VERSION else "not a version this one knows"
        super().__init__(f"{path}: log format version {found}, {who} (this hier_sched reads version "
                         f"{FORMAT_VERSION}); refusing to read it rather than misread it")


class WalCorruptError(WalError):
    """Damage that a crash cannot explain; replaying past it would lose or invent events."""


class WalLockedError(WalError):
    """Another writer holds the log."""


@dataclass(frozen=True)
class Snapshot:
    seq: int      # the last record sequence number it covers (0: taken before any record)
    value: Any


@dataclass(frozen=True)
class Damage:
    """A torn or corrupt tail found, and cut off, by ``open``."""

    file: Path
    offset: int            # byte offset of the first bad frame: everything before it was kept
    truncated_bytes: int
    reason: str
    saved_to: Path         # the cut-off bytes, kept for inspection

    def __str__(self) -> str:
        return (f"{self.file}: damaged tail at byte {self.offset} ({self.reason}); "
                f"{self.truncated_bytes} bytes cut off and saved to {self.saved_to}")


@dataclass(frozen=True)
class Recovered:
    """What ``open`` found: replay ``snapshot.value`` (if any), then ``records`` in order."""

    snapshot: Snapshot | None
    records: list[Any]     # records[i] has sequence number first_seq + i
    damage: Damage | None

    @property
    def first_seq(self) -> int:
        return (self.snapshot.seq if self.snapshot else 0) + 1


class WriteAheadLog:
    """The single writer of one log directory: get one from ``WriteAheadLog.open``. Thread-safe."""

    def __init__(self, directory: Path, lock_fd: int, fsync: bool):
        self.directory = directory
        self._lock_fd: int | None = lock_fd
        self._fsync = fsync
        self._fd: int | None = None        # the newest segment, opened for appending
        self._segment_first = 0            # its first sequence number
        self._next_seq = 1
        self._failed: BaseException | None = None  # a write or compaction that did not finish
        self._mutex = threading.Lock()

    @classmethod
    def open(cls, directory: str | Path, *, fsync: bool = True) -> tuple["WriteAheadLog", Recovered]:
        """Open the log in ``directory`` (created if missing), lock it, recover what it holds.

        ``fsync=False`` skips every fsync: a killed process still loses nothing (the kernel
        keeps what was written) but a machine crash may; for tests and simulations."""
        directory = Path(directory)
        # Private whatever the umask, also when the directory or its files (a restored copy)
        # existed with looser modes; files created later are created 0600.
        private_dir(directory)
        for path in directory.iterdir():
            if path.is_file() and not path.is_symlink():
                path.chmod(0o600)
        log = cls(directory, _lock(directory), fsync)
        try:
            return log, log._recover()
        except BaseException:
            log.close()
            raise

    @property
    def last_seq(self) -> int:
        """Sequence number of the last record appended (0 when none ever was)."""
        return self._next_seq - 1

    def append(self, record: Any) -> int:
        """Write ``record`` and fsync it; returns its sequence number."""
        return self.append_many([record])[0]

    def append_many(self, records: Iterable[Any], *, sync: bool = True) -> range:
        """Write ``records`` with one write and one fsync (group commit); returns their
        sequence numbers. A record msgpack cannot round-trip raises before anything is written.
        ``sync=False``: no fsync of its own (records a crash of the machine may lose until the
        next append that syncs; a killed process loses nothing)."""
        with self._mutex:
            self._check_writable()
            first = self._next_seq
            frames = [_frame(_pack([first + i, record])) for i, record in enumerate(records)]
            if frames:
                self._write(b"".join(frames), sync)
                self._next_seq += len(frames)
            return range(first, first + len(frames))

    def compact(self, snapshot: Any) -> None:
        """Make ``snapshot`` — the caller's state after every record appended so far — the new
        start of the log, and delete the segments it covers (``begin_compaction``, then
        ``finish_compaction``)."""
        self.finish_compaction(self.begin_compaction(), snapshot)

    def begin_compaction(self) -> int:
        """Start a compaction: later appends go to a new segment. Returns the last sequence number
        the snapshot must cover; the caller takes its snapshot of that state now (under the lock
        that orders its appends) and may write it with ``finish_compaction`` while appending on."""
        with self._mutex:
            self._check_writable()
            covered = self._next_seq - 1
            try:
                if self._segment_first != covered + 1:  # else the newest segment is still empty
                    self._start_segment(covered + 1)
            except BaseException as exc:
                self._failed = exc
                raise
            return covered

    def finish_compaction(self, covered: int, snapshot: Any) -> None:
        """Write ``snapshot`` (the state after record ``covered``) as the log's start and delete
        the segments it covers. Order, so that a crash anywhere replays to the same state: the
        segment after ``covered`` is already on disk; snapshot to a temporary file, fsync,
        rename, fsync the directory; then delete the old segments (until then replay skips
        their records: the snapshot covers them). One compaction at a time."""
        data = [_HEADER.pack(MAGIC, FORMAT_VERSION), *_frame_pieces(_pack_in_pieces([covered, snapshot]))]
        tmp = self.directory / _SNAPSHOT_TMP
        try:
            _write_file(tmp, data, self._fsync, replace=True)
            os.replace(tmp, self.directory / _SNAPSHOT)
            with self._mutex:
                self._check_writable()
                self._sync_directory()
                self._remove_segments_before(covered + 1)
        except BaseException as exc:
            # Appending on after a half-done compaction could put records in a segment that
            # replay will skip as covered: stop, as a crash would; reopening finishes the job.
            with self._mutex:
                self._failed = self._failed or exc
            raise

    def close(self) -> None:
        """Release the files and the lock. Writes nothing: all that was acknowledged is on disk."""
        with self._mutex:
            for fd in (self._fd, self._lock_fd):
                if fd is not None:
                    os.close(fd)
            self._fd = self._lock_fd = None

    def __enter__(self) -> "WriteAheadLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _recover(self) -> Recovered:
        snapshot = _read_snapshot(self.directory / _SNAPSHOT)
        covered = snapshot.seq if snapshot else 0
        records, damage, newest, next_seq = _read_segments(self.directory, covered, self._fsync)
        (self.directory / _SNAPSHOT_TMP).unlink(missing_ok=True)  # a compaction that never renamed
        if newest is None or next_seq <= covered:
            # no segment yet, or a crash right after a snapshot's rename that covers them all
            next_seq = covered + 1
            self._start_segment(next_seq)
            self._remove_segments_before(next_seq)
        else:
            self._segment_first = newest
            self._fd = os.open(self._segment_path(newest), os.O_WRONLY | os.O_APPEND)
        self._next_seq = next_seq
        return Recovered(snapshot, [record for seq, record in records if seq > covered], damage)

    def _check_writable(self) -> None:
        if self._fd is None:
            raise WalError(f"write-ahead log {self.directory} is closed")
        if self._failed is not None:
            raise WalError(f"write-ahead log {self.directory} failed to write earlier ({self._failed!r}); "
                           "open it again to recover") from self._failed

    def _write(self, blob: bytes, sync: bool = True) -> None:
        size = os.fstat(self._fd).st_size
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(self._fd, view):]
            if self._fsync and sync:
                os.fdatasync(self._fd)  # data and the file size; no need to flush the mtime
        except BaseException as exc:
            # After a failed (or interrupted) write or fsync what is on disk is unknown: a partial
            # frame, pages the kernel dropped. Take back what this call wrote, as far as we still
            # can, and accept nothing more; reopening reads the disk again and cuts off the rest.
            self._failed = exc
            try:
                os.ftruncate(self._fd, size)
            except OSError:
                pass
            raise

    def _segment_path(self, first_seq: int) -> Path:
        return self.directory / f"log-{first_seq:020d}.wal"

    def _start_segment(self, first_seq: int) -> None:
        path = self._segment_path(first_seq)
        _write_file(path, _HEADER.pack(MAGIC, FORMAT_VERSION), self._fsync)
        self._sync_directory()
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self._segment_first = first_seq

    def _remove_segments_before(self, first_seq: int) -> None:
        for first, path in _segments(self.directory):
            if first < first_seq:
                path.unlink()
        self._sync_directory()

    def _sync_directory(self) -> None:
        if self._fsync:  # makes creations, renames and deletions durable
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


# ---------------------------------------------------------------------- file format
def _pack(value: Any) -> bytes:
    payload = msgpack.packb(value, use_bin_type=True)
    msgpack.unpackb(payload, **_UNPACK)  # refuse now what could not be read back later
    return payload


def _pack_in_pieces(value: Any, depth: int = 3) -> list[bytes]:
    """``msgpack.packb(value)`` in pieces that join to the same bytes: the outer ``depth`` levels of
    lists and dicts by their headers, what lies below each in one call. One ``packb`` of a snapshot
    of a hundred thousand jobs held the GIL for a second, and every thread of the queue with it;
    between pieces the interpreter lets the others run, and the pieces are written as they are
    (``_frame_pieces``), never joined into one more copy. Not read back to check, as ``_pack``
    does: a snapshot holds records that each went through ``_pack`` when appended."""
    packer = msgpack.Packer(use_bin_type=True)
    pieces: list[bytes] = []

    def walk(item: Any, levels: int) -> None:
        if levels and isinstance(item, (list, tuple)):
            pieces.append(packer.pack_array_header(len(item)))
            for x in item:
                walk(x, levels - 1)
        elif levels and isinstance(item, dict):
            pieces.append(packer.pack_map_header(len(item)))
            for key, x in item.items():
                pieces.append(packer.pack(key))
                walk(x, levels - 1)
        else:
            pieces.append(packer.pack(item))

    walk(value, depth)
    return pieces


def _frame_pieces(pieces: list[bytes]) -> list[bytes]:
    """The frame of the joined ``pieces`` (length, CRC, payload), as pieces: a payload over the
    frame's 4 GiB limit raises before anything is written."""
    size = sum(len(p) for p in pieces)
    if size > 0xFFFFFFFF:
        raise ValueError(f"a record of {size} bytes exceeds the 4 GiB frame limit")
    length = struct.pack(">I", size)
    crc = zlib.crc32(length)
    for piece in pieces:
        crc = zlib.crc32(piece, crc)
    return [length, struct.pack(">I", crc), *pieces]


def _frame(payload: bytes) -> bytes:
    return b"".join(_frame_pieces([payload]))


def _check_header(path: Path, data: bytes) -> None:
    magic, version = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WalFormatError(f"{path}: not a hier_sched write-ahead log file (starts with {magic!r}, "
                             f"expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise WalVersionError(path, version)


def _scan(data: bytes, pos: int, expect_seq: int | None) -> tuple[list[tuple[int, Any]], int, str | None]:
    """Decode frames from ``pos`` on: (records as (seq, value), the offset after the last good
    one, why decoding stopped before the end or None). ``expect_seq`` None: any count (a snapshot)."""
    records, view = [], memoryview(data)
    while pos < len(data):
        if len(data) - pos < _FRAME.size:
            return records, pos, f"incomplete frame header ({len(data) - pos} of {_FRAME.size} bytes)"
        length, crc = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length
        if end > len(data):
            return records, pos, f"incomplete record ({len(data) - pos - _FRAME.size} of {length} bytes)"
        payload = view[pos + _FRAME.size:end]
        if zlib.crc32(payload, zlib.crc32(view[pos:pos + 4])) != crc:
            return records, pos, "checksum mismatch"
        try:
            seq, record = msgpack.unpackb(payload, **_UNPACK)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            return records, pos, f"undecodable record ({type(exc).__name__})"
        if type(seq) is not int or seq < 0 or (expect_seq is not None and seq != expect_seq):
            return records, pos, f"sequence number {seq!r} where {expect_seq} was expected"
        records.append((seq, record))
        pos = end
        if expect_seq is not None:
            expect_seq += 1
    return records, pos, None


def _read_snapshot(path: Path) -> Snapshot | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) < _HEADER.size:
        why = f"{len(data)} bytes, shorter than its header"
    else:
        _check_header(path, data)
        found, _, why = _scan(data, _HEADER.size, None)
        if why is None and len(found) == 1:
            return Snapshot(*found[0])
        why = why or f"{len(found)} frames instead of one"
    raise WalCorruptError(f"{path}: snapshot is damaged ({why}); refusing to start from an empty queue — "
                          "restore the file or move the directory aside")


def _segments(directory: Path) -> list[tuple[int, Path]]:
    """(first sequence number, path) of every segment, oldest first."""
    matches = [_SEGMENT.fullmatch(name) for name in os.listdir(directory)]
    return sorted((int(m.group(1)), directory / m.group(0)) for m in matches if m)


def _read_segments(directory: Path, covered: int, fsync: bool):
    """Read every segment and cut a damaged tail off the newest. Returns (records as (seq,
    value), the damage or None, the newest segment's first sequence number or None, the next
    sequence number)."""
    segments = _segments(directory)
    # Segments the snapshot covers whole (left by a crash inside compact) are not needed.
    while len(segments) > 1 and segments[1][0] <= covered + 1:
        segments.pop(0)
    if segments and segments[0][0] > covered + 1:
        raise WalCorruptError(f"{segments[0][1]}: records {covered + 1}..{segments[0][0] - 1} are missing "
                              f"(the snapshot covers up to {covered})")
    records: list[tuple[int, Any]] = []
    damage, next_seq = None, covered + 1
    for index, (first, path) in enumerate(segments):
        newest = index == len(segments) - 1
        if index and first != next_seq:
            raise WalCorruptError(f"{path}: starts at record {first}, the segment before it ends at {next_seq - 1}")
        data = path.read_bytes()
        if len(data) >= _HEADER.size:
            _check_header(path, data)
            found, end, why = _scan(data, _HEADER.size, first)
        else:  # a crash while a compaction created this segment
            found, end, why = [], 0, "incomplete file header"
        if why is not None:
            if not newest:
                raise WalCorruptError(f"{path}: {why} at byte {end} of a segment that is not the newest, "
                                      "which a crash cannot damage; refusing to replay past a hole")
            damage = _cut_tail(path, data, end, why, fsync)
        records += found
        next_seq = first + len(found)
    return records, damage, (segments[-1][0] if segments else None), next_seq


def _cut_tail(path: Path, data: bytes, offset: int, why: str, fsync: bool) -> Damage:
    """Copy ``data[offset:]`` aside, then cut the file there (rewriting the header if it was torn)."""
    saved = path.with_name(f"{path.name}.damaged-{offset}")
    _write_file(saved, data[offset:], fsync, replace=True)
    if offset < _HEADER.size:
        _write_file(path, _HEADER.pack(MAGIC, FORMAT_VERSION), fsync, replace=True)
    else:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, offset)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
    return Damage(path, offset, len(data) - offset, why, saved)


def _write_file(path: Path, data: bytes | list[bytes], fsync: bool, *, replace: bool = False) -> None:
    """Write a private (0600) file of ``data`` (bytes, or pieces written in turn); ``replace``
    False: it must not exist yet."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if replace else os.O_EXCL), 0o600)
    try:
        for piece in [data] if isinstance(data, bytes) else data:
            view = memoryview(piece)
            while view:
                view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _lock(directory: Path) -> int:
    """Take the directory's writer lock (released when the descriptor closes, also by a crash)."""
    fd = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise WalLockedError(f"write-ahead log {directory} is already open by another writer (pid {holder}); "
                             "only one may hold it at a time") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)  # named in the other writer's error
    return fd
