"""Property-based tests of the write-ahead log reader: any records round-trip, and any torn,
truncated, bit-flipped or overwritten file yields either a documented error or a prefix of what
was written that keeps every record before the damage.

More examples: HIER_SCHED_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest -q tests/common/test_wal_fuzz.py
"""

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hier_sched.common import wal
from hier_sched.common.wal import MAGIC, WalError, WalFormatError, WalVersionError, WriteAheadLog

EXAMPLES = int(os.environ.get("HIER_SCHED_FUZZ_EXAMPLES", "150"))
HEADER_SIZE = len(MAGIC) + 4
fuzz = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# What a job event can hold. NaN is left out only because NaN != NaN would fail the comparison.
scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False)
           | st.text(max_size=40) | st.binary(max_size=40))
records = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)
batches = st.lists(st.lists(records, min_size=1, max_size=5), min_size=1, max_size=6)


@contextmanager
def fresh_directory():
    with tempfile.TemporaryDirectory() as parent:
        yield Path(parent) / "wal"


def reopen(directory):
    log, recovered = WriteAheadLog.open(directory, fsync=False)
    log.close()
    return recovered


def written(directory, batches):
    """Append the batches; returns every record and its frame's (start, end) in the segment."""
    with WriteAheadLog.open(directory, fsync=False)[0] as log:
        for batch in batches:
            log.append_many(batch)
    (segment,) = directory.glob("log-*.wal")
    data, pos, spans = segment.read_bytes(), HEADER_SIZE, []
    while pos < len(data):
        end = pos + 8 + int.from_bytes(data[pos:pos + 4], "big")
        spans.append((pos, end))
        pos = end
    return [r for batch in batches for r in batch], segment, data, spans


@fuzz
@given(batches)
def test_any_records_round_trip(batches):
    with fresh_directory() as directory:
        everything, *_ = written(directory, batches)
        assert reopen(directory).records == everything


damages = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("flip"), st.floats(0, 1, exclude_max=True), st.integers(0, 7)),
    st.tuples(st.just("overwrite"), st.floats(0, 1, exclude_max=True), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=64)),
)


def damage(data: bytes, how) -> tuple[bytes, int]:
    """The damaged bytes, and the offset of the first byte that changed."""
    if how[0] == "truncate":
        at = int(how[1] * len(data))
        return data[:at], at
    if how[0] == "flip":
        at = int(how[1] * len(data))
        return data[:at] + bytes([data[at] ^ (1 << how[2])]) + data[at + 1:], at
    if how[0] == "overwrite":
        at = int(how[1] * len(data))
        return data[:at] + how[2] + data[at + len(how[2]):], at
    return data + how[1], len(data)


@fuzz
@given(batches, damages)
def test_damage_never_invents_a_record_nor_loses_one_before_it(batches, how):
    with fresh_directory() as directory:
        everything, segment, data, spans = written(directory, batches)
        damaged, at = damage(data, how)
        segment.write_bytes(damaged)
        intact = sum(1 for _, end in spans if end <= at)  # records wholly before the damage
        try:
            recovered = reopen(directory)
        except WalError as exc:
            # Only a damaged header is refused (a complete one that is not ours, or another version).
            assert isinstance(exc, (WalFormatError, WalVersionError)) and at < HEADER_SIZE <= len(damaged), exc
            return
        kept = recovered.records
        assert kept == everything[:len(kept)], "a record that was never written"
        assert len(kept) >= intact, "a record before the damage was lost"
        if how[0] in ("truncate", "flip"):  # CRC-32 catches every single-bit error
            assert len(kept) == intact
        report = recovered.damage
        if report is None:  # silence only for a file that is a clean shorter log (cut at a frame end)
            assert damaged == data[:len(damaged)] and len(damaged) in {HEADER_SIZE} | {e for _, e in spans}
        else:  # the cut is right after the last record kept, and the cut-off bytes are kept aside
            assert report.offset == (0 if len(damaged) < HEADER_SIZE else spans[len(kept) - 1][1] if kept
                                     else HEADER_SIZE)
            assert report.saved_to.read_bytes() == damaged[report.offset:]
        # after recovery the log takes appends cleanly
        with WriteAheadLog.open(directory, fsync=False)[0] as log:
            log.append("after")
        assert reopen(directory).records == kept + ["after"]


@fuzz
@given(st.lists(records, max_size=5), damages)
def test_a_damaged_snapshot_is_always_refused(snapshot_value, how):
    with fresh_directory() as directory:
        with WriteAheadLog.open(directory, fsync=False)[0] as log:
            log.compact(snapshot_value)
        path = directory / "snapshot"
        data = path.read_bytes()
        damaged, _ = damage(data, how)
        if damaged == data:
            return
        path.write_bytes(damaged)
        try:
            recovered = reopen(directory)
        except WalError:
            return
        raise AssertionError(f"a damaged snapshot was read as {recovered.snapshot!r}")


# ---------------------------------------------------------------------- crashes inside compact
class Crash(Exception):
    pass


CRASH_AT = [None, "os.replace", "_start_segment", "_remove_segments_before"]
steps = st.lists(st.one_of(st.tuples(st.just("append"), st.lists(records, min_size=1, max_size=3)),
                           st.tuples(st.just("compact"), st.sampled_from(CRASH_AT)),
                           st.just(("reopen",))), max_size=12)


@settings(max_examples=max(20, EXAMPLES // 3), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_any_history_of_appends_compactions_and_crashes_replays_to_the_same_state(steps):
    """The state is the list of every record; a snapshot is that list, so replay must rebuild it."""
    with fresh_directory() as directory:
        state: list = []
        log, _ = WriteAheadLog.open(directory, fsync=False)
        try:
            for step in steps:
                if step[0] == "append":
                    log.append_many(step[1])
                    state += step[1]
                elif step[0] == "compact" and step[1] is None:
                    log.compact(list(state))
                else:
                    if step[0] == "compact":  # crash at that point, then come back
                        target = wal.os if step[1] == "os.replace" else WriteAheadLog
                        name = step[1].split(".")[-1]
                        with mock.patch.object(target, name, side_effect=Crash):
                            try:
                                log.compact(list(state))
                            except Crash:
                                pass
                    log.close()
                    log, recovered = WriteAheadLog.open(directory, fsync=False)
                    assert (list(recovered.snapshot.value) if recovered.snapshot else []) + recovered.records \
                        == state
                    assert recovered.damage is None and log.last_seq == len(state)
        finally:
            log.close()
