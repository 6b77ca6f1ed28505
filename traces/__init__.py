"""Traces: every job source (thesis traces, Gavel, Alibaba openb, synthetic Philly, users' files)
loaded into one ``Trace`` of ``TraceJob`` values.

    >>> from traces import load_trace, describe
    >>> print(describe(load_trace("carma:philly_mix-90-tasks")))
"""

from traces.registry import known_traces, load_trace
from traces.schema import ClusterHint, Trace, TraceError, TraceJob
from traces.summary import describe

__all__ = ["load_trace", "known_traces", "describe", "Trace", "TraceJob", "ClusterHint", "TraceError"]
