"""The Ray names of the scheduler's actors: how every client, on any node, finds them.

Both shells (``global_queue``, ``node_actor``) and the clients read them from here, so the
global queue does not import the node actor's module to learn a name.
"""

from __future__ import annotations

__all__ = ["NAMESPACE", "GLOBAL_NAME", "NODE_NAME_PREFIX", "WATCHER_NAME", "HEAD_RESOURCE", "ON_THE_HEAD",
           "node_actor_name"]

NAMESPACE = "hier_sched"
GLOBAL_NAME = "hier_sched:global"
NODE_NAME_PREFIX = "hier_sched:node:"
WATCHER_NAME = "hier_sched:node-watcher"  # on clusters whose nodes come and go (``front.node_watcher``)

# Ray gives the head node this resource, whichever machine is the head now. The queue and the node
# watcher ask for a sliver of it (as Ray Serve's controller and Ray Train's state actor do) rather
# than for the head's node id: under GCS fault tolerance a restarted head is a new Ray node, and an
# actor pinned to the old one's id could never be placed again. The queue's log is a path on the
# head, so a head that comes back must find it again (the same disk, or a volume mounted again).
HEAD_RESOURCE = "node:__internal_head__"
ON_THE_HEAD = {"resources": {HEAD_RESOURCE: 0.001}}


def node_actor_name(node: str) -> str:
    return f"{NODE_NAME_PREFIX}{node}"
