"""The front door: the command line, the Python client, deploying a cluster, the demo and the benches.

The only part of ``hier_sched`` that imports the shells and the libraries; nothing below imports
it (``hier_sched/__init__.py`` re-exports the client by name).
"""
