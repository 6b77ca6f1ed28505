"""The shared floor: what the shells, the libraries and the job side all use, above the core.

The messages between the live shells, the write-ahead log, paths and private files, metrics, the
actors' Ray names, the job side of the checkpoint and settling protocols, spec files, console and
plot style. It imports only ``hier_sched.core``.
"""
