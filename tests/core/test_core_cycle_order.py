"""The cycle's order with team queues, worked out as far as it is read, against the plain algorithm
that puts every job in its tier and gives every turn first."""

from __future__ import annotations

import heapq
import random

import pytest

from hier_sched.core.cycle_order import cycle_order
from hier_sched.core.queued_job import QueuedJob, queue_order
from hier_sched.core.quota_book import QuotaBook, QuotaRun
from hier_sched.core.quotas import ZERO, Charge, QueueQuota, QueueSetup
from hier_sched.core.team_queues import by_queue, entitlements

MIB = 40960.0


def plain_order(order, queues, book, owed, turns):
    """Every job in its tier, then the tiers' turns (all of the first two, ``turns`` of the last),
    then the rest in queue order."""
    tiers = ({}, {}, {})
    for name, jobs in queues.items():
        within_nominal, within_level, used = book.within_of(name, book.nominal(name)), None, ZERO
        for i, q in enumerate(jobs):
            after = used + book.charge_of(q.job_id)
            if within_nominal(after):
                tier = 0
            else:
                within_level = within_level or book.within_of(name, owed.owed.get(name, ZERO))
                tier = 1 if within_level(after) else 2
            if tier == 2:
                tiers[2][name] = jobs[i:]
                break
            tiers[tier].setdefault(name, []).append(q)
            used = after
    counted, first = {}, []
    for tier, jobs_of in enumerate(tiers):
        limit = turns if tier == 2 else None
        share = {name: book.order_share_of(name) for name in jobs_of}
        heap = [(share[name](counted.get(name, ZERO)), name) for name in jobs_of]
        heapq.heapify(heap)
        nxt, out = dict.fromkeys(jobs_of, 0), []
        while heap and (limit is None or len(out) < limit):
            _, name = heapq.heappop(heap)
            jobs = jobs_of[name]
            if not heap:  # the last queue: the rest of its jobs (not counted)
                out.extend(jobs[nxt[name]:] if limit is None else jobs[nxt[name]:nxt[name] + limit - len(out)])
                break
            out.append(jobs[nxt[name]])
            nxt[name] += 1
            counted[name] = counted.get(name, ZERO) + book.charge_of(out[-1].job_id)
            if nxt[name] < len(jobs):
                heapq.heappush(heap, (share[name](counted[name]), name))
        first += out
    listed = {id(q) for q in first}
    return first + [q for q in order if id(q) not in listed]


def scenario(seed: int):
    """A book of a few team queues, some running, many jobs waiting."""
    rng = random.Random(seed)
    names = [f"q{i}" for i in range(rng.randint(2, 6))]
    setup = QueueSetup(tuple(QueueQuota(n, rng.randint(0, 6), weight=rng.choice((1.0, 2.0, 3.0)),
                                        borrowing_limit_gpus=rng.choice((None, 2, 8))) for n in names))
    book = QuotaBook(setup)
    book.set_capacity(Charge(24, 24 * MIB))
    for i in range(rng.randint(0, 10)):
        queue, gpus = rng.choice(names), rng.randint(1, 2)
        book.start(QuotaRun(f"r{i}", queue, Charge(gpus, gpus * 20000.0), 0, 0.0, True, False), float(i))
    book.advance(600.0)
    jobs = []
    for i in range(rng.randint(5, 60)):
        gpus = rng.choice((1, 1, 1, 2, 4))
        q = QueuedJob(f"j{i}", float(i), gpus=gpus, need_mib=rng.choice((8000.0, 20000.0)), seq=i,
                      priority=rng.choice((0, 0, 1)), queue=rng.choice(names))
        book.enqueued(q.job_id, q.queue, q.charge(0.0))
        jobs.append(q)
    order = queue_order(jobs, True)
    return order, by_queue(order), book


@pytest.mark.parametrize("seed", range(40))
def test_the_order_read_is_the_plain_algorithms_however_far_and_in_whatever_way_it_is_read(seed):
    order, queues, book = scenario(seed)
    turns = random.Random(seed).randint(1, 12)
    expected = [q.job_id for q in plain_order(order, queues, book, entitlements(book), turns)]
    assert [q.job_id for q in cycle_order(order, queues, book, entitlements(book), turns)] == expected
    stop = random.Random(-seed).randint(1, len(order))
    lazy = cycle_order(order, queues, book, entitlements(book), turns)
    assert [q.job_id for q in lazy[:stop]] == expected[:stop]  # read in part first, then all of it
    assert lazy[stop - 1].job_id == expected[stop - 1] and [q.job_id for q in lazy] == expected
    assert lazy[-1].job_id == expected[-1] and len(lazy) == len(expected)


def test_an_order_frozen_before_the_book_changes_keeps_what_was_read_and_then_is_the_queue_order():
    order, queues, book = scenario(3)
    lazy = cycle_order(order, queues, book, entitlements(book), turns=4)
    read = [q.job_id for q in lazy[:5]]
    assert read == [q.job_id for q in plain_order(order, queues, book, entitlements(book), 4)][:5]
    lazy.freeze()
    first = order[0]
    book.dequeued(first.job_id)  # the book moves on: nothing more is worked out from it
    queues[first.queue].remove(first)
    assert [q.job_id for q in lazy] == read + [q.job_id for q in order if q.job_id not in read]
