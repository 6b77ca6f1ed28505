"""The Ray names of the scheduler's actors: how every client, on any node, finds them.

Both shells (``global_queue``, ``node_actor``) and the clients read them from here, so the
global queue does not import the node actor's module to learn a name.
"""

from __future__ import annotations

__all__ = ["NAMESPACE", "GLOBAL_NAME", "NODE_NAME_PREFIX", "WATCHER_NAME", "node_actor_name"]

NAMESPACE = "hier_sched"
GLOBAL_NAME = "hier_sched:global"
NODE_NAME_PREFIX = "hier_sched:node:"
WATCHER_NAME = "hier_sched:node-watcher"  # on clusters whose nodes come and go (``front.node_watcher``)


def node_actor_name(node: str) -> str:
    return f"{NODE_NAME_PREFIX}{node}"
