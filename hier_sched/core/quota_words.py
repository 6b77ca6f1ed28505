"""The book of team queues in words: the table of ``hier-sched queues`` (``queue_rows``) and what a
reclaim takes back for a queue (``reclaim_words``, a waiting job's reason).
"""

from __future__ import annotations

import math
from typing import Any

from hier_sched.core.quota_book import QuotaBook, ratio_words
from hier_sched.core.quotas import CURRENCIES, ZERO

__all__ = ["queue_rows", "reclaim_words"]


def reclaim_words(book: QuotaBook, queue: str) -> str | None:
    """What is being taken back for ``queue``, in words, or None."""
    leaving = [job_id for job_id, reclaimer in book.leaving.items() if reclaimer == queue]
    if not leaving:
        return None
    others = sorted({book.runs[j].queue for j in leaving} - {queue})
    what = []
    if others:
        used = ratio_words("gpus", book.usage.get(queue, ZERO).gpus, book.quota(queue).nominal_gpus)
        what.append(f"queue {queue} holds {used} of its nominal quota: reclaiming from {', '.join(others)}")
    if any(book.runs[j].queue == queue for j in leaving):
        what.append(f"queue {queue} preempts its runs of lower priority")
    return f"{'; '.join(what)}: checkpoint signal sent to {', '.join(leaving)}"


def queue_rows(book: QuotaBook) -> list[dict[str, Any]]:
    """Each queue's quota, use, fair share and waiting jobs, for ``hier-sched queues``: the
    configured queues in their order, then the others that run or wait jobs (``default``).
    MiB in the JSON; None where a figure is not governed or not limited."""
    waiting = {name: n for name, n in book.waiting_jobs.items() if n}
    names = list(book.quotas)
    names += sorted(({n for n, use in book.usage.items() if use.gpus or use.mib} | set(waiting)) - set(names))
    fair = book.fair_shares(book.demand())

    def figure(value: float | None) -> float | None:
        return None if value is None or math.isinf(value) else round(value, 3)

    rows = []
    for name in names:
        q = book.quota(name)
        use = book.usage.get(name, ZERO)
        row: dict[str, Any] = {"name": name, "cohort": q.cohort, "weight": q.weight}
        for c in CURRENCIES:
            nominal = q.nominal(c)
            row[f"nominal_{c}"] = figure(nominal)
            row[f"borrowing_limit_{c}"] = figure(q.borrowing_limit(c))
            row[f"lending_limit_{c}"] = figure(q.lending_limit(c))
            row[f"used_{c}"] = figure(use.of(c))
            row[f"borrowed_{c}"] = None if nominal is None else figure(max(0.0, use.of(c) - nominal))
            row[f"fair_share_{c}"] = figure(fair[name].of(c)) if name in fair else None
        row["share"] = round(book.order_share(name), 4)
        row["waiting"] = waiting.get(name, 0)
        rows.append(row)
    return rows
