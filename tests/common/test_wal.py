"""The write-ahead log (hier_sched/common/wal.py): durability, recovery from torn and corrupt tails,
compaction under crashes, version refusal, private files and the single-writer lock."""

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from hier_sched.common import wal
from hier_sched.common.wal import (FORMAT_VERSION, MAGIC, WalCorruptError, WalError, WalFormatError, WalLockedError,
                                   WalVersionError, WriteAheadLog)
from hier_sched.front.bench.wal import job_event as event

HEADER_SIZE = len(MAGIC) + 4


def replayed(recovered) -> list:
    """The tests' state machine: the snapshot is the list of every record so far."""
    return (list(recovered.snapshot.value) if recovered.snapshot else []) + recovered.records


def segment_files(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("log-") and p.name.endswith(".wal"))


def only_segment(directory):
    (name,) = segment_files(directory)
    return directory / name


def frame_offsets(path) -> list[int]:
    """Byte offset of every frame in a segment, read independently of the module."""
    data, pos, offsets = path.read_bytes(), HEADER_SIZE, []
    while pos < len(data):
        offsets.append(pos)
        pos += 8 + int.from_bytes(data[pos:pos + 4], "big")
    return offsets


def reopen(directory, **kw):
    log, recovered = WriteAheadLog.open(directory, **kw)
    log.close()
    return recovered


# ---------------------------------------------------------------------- round trips
def test_records_come_back_in_order_with_their_sequence_numbers(tmp_path):
    log, recovered = WriteAheadLog.open(tmp_path / "wal")
    assert recovered.snapshot is None and recovered.records == [] and recovered.damage is None
    assert log.append(event(1)) == 1
    assert log.append_many([event(2), event(3)]) == range(2, 4)
    assert log.append_many([]) == range(4, 4) and log.last_seq == 3
    log.close()
    recovered = reopen(tmp_path / "wal")
    assert recovered.records == [event(1), event(2), event(3)] and recovered.first_seq == 1


def test_reopened_log_continues_its_sequence(tmp_path):
    with WriteAheadLog.open(tmp_path)[0] as log:
        log.append_many([1, 2])
    with WriteAheadLog.open(tmp_path)[0] as log:
        assert log.last_seq == 2 and log.append("three") == 3
    assert reopen(tmp_path).records == [1, 2, "three"]


def test_a_record_msgpack_cannot_read_back_is_refused_before_anything_is_written(tmp_path):
    log, _ = WriteAheadLog.open(tmp_path)
    log.append(1)
    with pytest.raises(TypeError):
        log.append_many([2, object()])
    with pytest.raises(TypeError):  # packs (a tuple key becomes a list) but could never be read back
        log.append({(1, 2): "x"})
    assert log.append(3) == 2
    log.close()
    assert reopen(tmp_path).records == [1, 3]


def test_group_commit_syncs_once_per_call(tmp_path, monkeypatch):
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real(fd)))
    log, _ = WriteAheadLog.open(tmp_path / "a")
    log.append_many([event(i) for i in range(100)])
    assert len(calls) == 1
    log.append(event(100))
    assert len(calls) == 2
    log.append_many([event(101)], sync=False)  # written, synced by the next append that syncs
    assert len(calls) == 2
    log.close()
    assert reopen(tmp_path / "a").records[-1] == event(101)
    log, _ = WriteAheadLog.open(tmp_path / "b", fsync=False)
    log.append_many([1, 2])
    log.close()
    assert len(calls) == 2


def test_a_closed_log_refuses_to_append(tmp_path):
    log, _ = WriteAheadLog.open(tmp_path)
    log.close()
    with pytest.raises(WalError, match="closed"):
        log.append(1)


def test_a_failed_sync_is_taken_back_and_stops_the_log(tmp_path, monkeypatch):
    log, _ = WriteAheadLog.open(tmp_path)
    log.append("kept")

    def failing(fd):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError):
        log.append("not acknowledged")
    monkeypatch.undo()
    with pytest.raises(WalError, match="failed to write earlier"):
        log.append("after the failure")
    log.close()
    assert reopen(tmp_path).records == ["kept"]


# ---------------------------------------------------------------------- compaction
def test_compaction_replays_snapshot_then_tail_and_drops_old_segments(tmp_path):
    log, _ = WriteAheadLog.open(tmp_path)
    log.append_many([1, 2, 3])
    log.compact([1, 2, 3])
    assert segment_files(tmp_path) == ["log-00000000000000000004.wal"]
    log.append(4)
    log.compact([1, 2, 3, 4])
    log.compact([1, 2, 3, 4])  # nothing new: the empty segment stays
    assert segment_files(tmp_path) == ["log-00000000000000000005.wal"]
    log.append(5)
    log.close()
    recovered = reopen(tmp_path)
    assert recovered.snapshot.seq == 4 and recovered.records == [5] and recovered.first_seq == 5
    assert replayed(recovered) == [1, 2, 3, 4, 5]


def test_a_snapshot_written_in_pieces_is_the_same_bytes_as_in_one():
    import msgpack

    snapshot = [41, {"version": 2, "records": [{"t": 1.5, "e": {"type": "Submitted", "gpus": (1, 2)}, "payload": b"\x80"},
                                               None, "x", [3, {"k": 4.0}]]}]
    pieces = wal._pack_in_pieces(snapshot)
    assert b"".join(pieces) == msgpack.packb(snapshot, use_bin_type=True)
    assert b"".join(wal._frame_pieces(pieces)) == wal._frame(b"".join(pieces))


def test_a_snapshot_taken_before_any_record_covers_nothing(tmp_path):
    with WriteAheadLog.open(tmp_path)[0] as log:
        log.compact([])
        log.append(1)
    recovered = reopen(tmp_path)
    assert recovered.snapshot.seq == 0 and recovered.records == [1]


class Crash(Exception):
    pass


def crash(*args, **kwargs):
    raise Crash


def crash_writing_temp_snapshot(monkeypatch):
    real = wal._write_file

    def half_then_crash(path, data, fsync, *, replace=False):
        if path.name != "snapshot.tmp":
            return real(path, data, fsync, replace=replace)
        real(path, data[:len(data) // 2], fsync, replace=replace)
        raise Crash

    monkeypatch.setattr(wal, "_write_file", half_then_crash)


CRASH_POINTS = {
    "while writing the temporary snapshot": crash_writing_temp_snapshot,
    "before the rename": lambda mp: mp.setattr(wal.os, "replace", crash),
    "before the new segment": lambda mp: mp.setattr(WriteAheadLog, "_start_segment", crash),
    "after the new segment, before old ones are deleted":
        lambda mp: mp.setattr(WriteAheadLog, "_remove_segments_before", crash),
}


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_anywhere_in_compaction_neither_loses_nor_repeats_a_record(tmp_path, monkeypatch, point):
    log, _ = WriteAheadLog.open(tmp_path)
    log.append_many([1, 2])
    log.compact([1, 2])
    log.append_many([3, 4, 5])
    CRASH_POINTS[point](monkeypatch)
    with pytest.raises(Crash):
        log.compact([1, 2, 3, 4, 5])
    monkeypatch.undo()
    with pytest.raises(WalError, match="failed to write earlier"):  # a process that lives on stops too
        log.append(6)
    log.close()  # writes nothing: the directory is left as the crash left it

    recovered = reopen(tmp_path)
    assert replayed(recovered) == [1, 2, 3, 4, 5] and recovered.damage is None
    assert not (tmp_path / "snapshot.tmp").exists()
    with WriteAheadLog.open(tmp_path)[0] as log:
        assert log.append(6) == 6
    assert replayed(reopen(tmp_path)) == [1, 2, 3, 4, 5, 6]
    with WriteAheadLog.open(tmp_path)[0] as log:
        log.compact([1, 2, 3, 4, 5, 6])
    assert segment_files(tmp_path) == ["log-00000000000000000007.wal"]
    assert not (tmp_path / "snapshot.tmp").exists()
    assert replayed(reopen(tmp_path)) == [1, 2, 3, 4, 5, 6]


def test_appends_go_on_while_a_compaction_writes_its_snapshot(tmp_path):
    log, _ = WriteAheadLog.open(tmp_path)
    log.append_many([1, 2, 3])
    covered = log.begin_compaction()
    log.append_many([4, 5])  # while the snapshot of 1-3 is written
    log.finish_compaction(covered, [1, 2, 3])
    log.append(6)
    log.close()
    recovered = reopen(tmp_path)
    assert recovered.snapshot.seq == 3 and replayed(recovered) == [1, 2, 3, 4, 5, 6]
    assert segment_files(tmp_path) == ["log-00000000000000000004.wal"]


@pytest.mark.parametrize("point", [p for p in CRASH_POINTS if p != "before the new segment"])
def test_a_crash_while_the_snapshot_is_written_beside_appends_loses_nothing(tmp_path, monkeypatch, point):
    log, _ = WriteAheadLog.open(tmp_path)
    log.append_many([1, 2, 3])
    covered = log.begin_compaction()
    log.append_many([4, 5])
    CRASH_POINTS[point](monkeypatch)
    with pytest.raises(Crash):
        log.finish_compaction(covered, [1, 2, 3])
    monkeypatch.undo()
    with pytest.raises(WalError, match="failed to write earlier"):
        log.append(6)
    log.close()
    assert replayed(reopen(tmp_path)) == [1, 2, 3, 4, 5]


def test_a_segment_the_snapshot_covers_whole_is_not_needed_even_damaged(tmp_path, monkeypatch):
    log, _ = WriteAheadLog.open(tmp_path)
    log.append_many([1, 2, 3])
    monkeypatch.setattr(WriteAheadLog, "_remove_segments_before", crash)
    with pytest.raises(Crash):
        log.compact([1, 2, 3])
    monkeypatch.undo()
    log.close()
    older = tmp_path / segment_files(tmp_path)[0]
    older.write_bytes(older.read_bytes()[:-1])  # a bad sector in what the snapshot made obsolete
    recovered = reopen(tmp_path)
    assert replayed(recovered) == [1, 2, 3] and recovered.damage is None


@pytest.mark.parametrize("size", range(HEADER_SIZE))
def test_a_torn_header_of_a_new_segment_is_rewritten(tmp_path, size):
    with WriteAheadLog.open(tmp_path)[0] as log:
        log.append_many([1, 2])
        log.compact([1, 2])
    segment = only_segment(tmp_path)
    segment.write_bytes(segment.read_bytes()[:size])
    recovered = reopen(tmp_path)
    assert replayed(recovered) == [1, 2]
    assert recovered.damage.reason == "incomplete file header" and recovered.damage.offset == 0
    with WriteAheadLog.open(tmp_path)[0] as log:
        assert log.append(3) == 3
    assert replayed(reopen(tmp_path)) == [1, 2, 3]


# ---------------------------------------------------------------------- torn and corrupt tails
def three_records(tmp_path, last=event(3)):
    with WriteAheadLog.open(tmp_path, fsync=False)[0] as log:
        log.append_many([event(1), event(2), last])
    segment = only_segment(tmp_path)
    return segment, segment.read_bytes(), frame_offsets(segment)


def test_a_tail_torn_at_any_byte_of_the_last_record_keeps_the_ones_before(tmp_path):
    segment, data, offsets = three_records(tmp_path)
    last = offsets[-1]
    assert len(data) - last > 250  # a realistic event
    for cut in range(last, len(data)):
        segment.write_bytes(data[:cut])
        recovered = reopen(tmp_path, fsync=False)
        assert recovered.records == [event(1), event(2)], cut
        if cut == last:
            assert recovered.damage is None  # a clean end: nothing torn
            continue
        damage = recovered.damage
        assert (damage.file, damage.offset, damage.truncated_bytes) == (segment, last, cut - last), cut
        assert damage.reason.startswith("incomplete"), damage.reason
        assert damage.saved_to.read_bytes() == data[last:cut]
        assert segment.stat().st_size == last
    with WriteAheadLog.open(tmp_path, fsync=False)[0] as log:  # appends after a cut are clean
        assert log.append("next") == 3
    assert reopen(tmp_path).records == [event(1), event(2), "next"]


def test_every_bit_flip_in_the_last_record_is_caught(tmp_path):
    segment, data, offsets = three_records(tmp_path, last={"type": "cancel", "job_id": "job-000003"})
    for bit in range(offsets[-1] * 8, len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        segment.write_bytes(damaged)
        recovered = reopen(tmp_path, fsync=False)
        assert recovered.records == [event(1), event(2)], bit
        assert recovered.damage.offset == offsets[-1], bit


def test_corruption_in_the_middle_ends_the_log_there_and_keeps_the_rest_aside(tmp_path):
    """Documented choice: the first bad frame ends the log (point-in-time recovery); what follows
    is not replayed past the hole, but saved next to the segment."""
    segment, data, offsets = three_records(tmp_path)
    damaged = bytearray(data)
    damaged[offsets[1] + 40] ^= 0xFF
    segment.write_bytes(damaged)
    recovered = reopen(tmp_path)
    assert recovered.records == [event(1)]
    assert recovered.damage.reason == "checksum mismatch" and recovered.damage.offset == offsets[1]
    assert recovered.damage.saved_to.read_bytes() == bytes(damaged[offsets[1]:])
    assert str(segment) in str(recovered.damage) and "checksum mismatch" in str(recovered.damage)


def test_a_zero_filled_tail_is_cut_off(tmp_path):
    segment, data, _ = three_records(tmp_path)
    segment.write_bytes(data + bytes(4096))  # what a file system may leave after a power cut
    recovered = reopen(tmp_path)
    assert recovered.records == [event(1), event(2), event(3)]
    assert recovered.damage.offset == len(data) and recovered.damage.truncated_bytes == 4096


def test_a_valid_frame_with_the_wrong_sequence_number_ends_the_log(tmp_path):
    segment, data, offsets = three_records(tmp_path)
    segment.write_bytes(data + data[offsets[0]:offsets[1]])  # record 1 again, at position 4
    recovered = reopen(tmp_path)
    assert len(recovered.records) == 3 and "sequence number 1 where 4" in recovered.damage.reason


# ---------------------------------------------------------------------- damage a crash cannot explain
def two_segments(tmp_path):
    """A directory whose records 1-3 and 4-5 lie in two segments and no snapshot covers them."""
    with WriteAheadLog.open(tmp_path / "a", fsync=False)[0] as log:
        log.append_many([1, 2, 3])
    with WriteAheadLog.open(tmp_path / "b", fsync=False)[0] as log:
        log.append_many([1, 2, 3])
        log.compact(None)
        log.append_many([4, 5])
    both = tmp_path / "both"
    both.mkdir()
    for source in (tmp_path / "a", tmp_path / "b"):
        name = segment_files(source)[0]
        (both / name).write_bytes((source / name).read_bytes())
    return both


def test_records_are_read_across_segments(tmp_path):
    assert reopen(two_segments(tmp_path)).records == [1, 2, 3, 4, 5]


def test_damage_in_an_older_segment_is_refused_and_left_alone(tmp_path):
    directory = two_segments(tmp_path)
    older = directory / segment_files(directory)[0]
    data = older.read_bytes()
    older.write_bytes(data[:-1])
    with pytest.raises(WalCorruptError, match="not the newest"):
        WriteAheadLog.open(directory)
    assert older.read_bytes() == data[:-1]
    with pytest.raises(WalCorruptError):  # the same refusal, not "locked": a refusal releases the lock
        WriteAheadLog.open(directory)


def test_a_gap_between_the_snapshot_and_the_log_is_refused(tmp_path):
    with WriteAheadLog.open(tmp_path)[0] as log:
        log.append_many([1, 2])
        log.compact([1, 2])
        log.append(3)
    (tmp_path / "snapshot").unlink()
    with pytest.raises(WalCorruptError, match=r"records 1\.\.2 are missing"):
        WriteAheadLog.open(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "bit flip", "empty", "trailing bytes"])
def test_a_damaged_snapshot_is_refused_not_replaced_by_an_empty_queue(tmp_path, damage):
    with WriteAheadLog.open(tmp_path)[0] as log:
        log.append_many([event(1), event(2)])
        log.compact([event(1), event(2)])
    snapshot = tmp_path / "snapshot"
    data = bytearray(snapshot.read_bytes())
    if damage == "truncated":
        data = data[:-10]
    elif damage == "bit flip":
        data[len(data) // 2] ^= 0x04
    elif damage == "empty":
        data = b""
    else:
        data += data[HEADER_SIZE:]
    snapshot.write_bytes(data)
    with pytest.raises(WalCorruptError, match="snapshot is damaged .* refusing to start from an empty queue"):
        WriteAheadLog.open(tmp_path)
    assert snapshot.read_bytes() == data


# ---------------------------------------------------------------------- versions and foreign files
@pytest.mark.parametrize("which", ["segment", "snapshot"])
def test_a_newer_format_version_is_refused_untouched(tmp_path, which):
    with WriteAheadLog.open(tmp_path)[0] as log:
        log.append(1)
        log.compact([1])
        log.append(2)
    path = only_segment(tmp_path) if which == "segment" else tmp_path / "snapshot"
    future = MAGIC + (FORMAT_VERSION + 1).to_bytes(4, "big") + b"a future record layout \x00\xff"
    path.write_bytes(future)
    with pytest.raises(WalVersionError) as refused:
        WriteAheadLog.open(tmp_path)
    assert (refused.value.path, refused.value.found, refused.value.supported) == (path, 2, 1)
    message = str(refused.value)
    assert str(path) in message and "version 2" in message and "reads version 1" in message
    assert "newer" in message
    assert path.read_bytes() == future  # not cut off as if it were a torn tail


def test_a_file_that_is_not_a_log_is_refused_untouched(tmp_path):
    with WriteAheadLog.open(tmp_path)[0] as log:
        log.append(1)
    segment = only_segment(tmp_path)
    segment.write_bytes(b"name,gpus\nresnet,1\n")
    with pytest.raises(WalFormatError, match="not a hier_sched write-ahead log file"):
        WriteAheadLog.open(tmp_path)
    assert segment.read_bytes() == b"name,gpus\nresnet,1\n"


# ---------------------------------------------------------------------- private files
def test_directory_and_every_file_are_private_whatever_the_umask(tmp_path):
    directory = tmp_path / "state" / "wal"
    directory.parent.mkdir(mode=0o755)
    directory.mkdir(mode=0o755)  # created by someone else, too open
    old_umask = os.umask(0)
    try:
        with WriteAheadLog.open(directory)[0] as log:
            log.append_many([1, 2])
            log.compact([1, 2])
            log.append(3)
        segment = only_segment(directory)
        segment.write_bytes(segment.read_bytes()[:-2])
        segment.chmod(0o644)
        reopen(directory)  # cuts the tail off, saving it aside
        with WriteAheadLog.open(tmp_path / "new")[0] as log:
            log.append(1)
    finally:
        os.umask(old_umask)
    for d in (directory, tmp_path / "new"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        files = list(d.iterdir())
        assert {p.name.split("-")[0] for p in files} >= {"lock", "log"}
        for path in files:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert any(".damaged-" in p.name for p in directory.iterdir())
    assert (directory / "snapshot").exists()


# ---------------------------------------------------------------------- one writer
def test_a_second_writer_is_refused_until_the_first_closes(tmp_path):
    log, _ = WriteAheadLog.open(tmp_path)
    with pytest.raises(WalLockedError, match=f"already open by another writer \\(pid {os.getpid()}\\)"):
        WriteAheadLog.open(tmp_path)
    log.append(1)
    log.close()
    with WriteAheadLog.open(tmp_path)[0] as log:
        assert log.last_seq == 1


def test_the_lock_holds_across_processes_and_dies_with_its_holder(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from hier_sched.common.wal import WriteAheadLog
            log, _ = WriteAheadLog.open({str(tmp_path)!r})
            log.append("from the other process")
            print("ready", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(WalLockedError, match=f"pid {holder.pid}"):
            WriteAheadLog.open(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash: no close()
        holder.wait()
        holder.stdout.close()
    assert reopen(tmp_path).records == ["from the other process"]
