"""The node id: one per node process, shared by its leases, seed claims and spool.

A node's id is ``<name>-<pid>-<random>``: ``name`` is ``NODE_ID`` (setting or
environment variable) or the host name, made safe for file names (the spool
names its files after it). The pid and the random part make it unique per
process *incarnation*: a process restarted with the same ``NODE_ID`` never
inherits the leases of the one that died (those are reclaimed when their
deadline passes), and two processes given the same ``NODE_ID`` by mistake do
not share leases.

:func:`node_id` returns the same id to every component of one crawler.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
import weakref

from crawlproject.defaults import setting

_SAFE = re.compile(r"[^A-Za-z0-9_-]")
_ids: "weakref.WeakKeyDictionary[object, str]" = weakref.WeakKeyDictionary()


def node_name(settings=None) -> str:
    """``NODE_ID`` (setting, then environment) or the host name, file-name safe."""
    name = setting(settings, "NODE_ID")
    name = name or socket.gethostname() or "node"
    return _SAFE.sub("_", str(name))[:60] or "node"


def new_node_id(settings=None) -> str:
    """A fresh id for this process: ``<name>-<pid>-<6 hex>``."""
    return f"{node_name(settings)}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def node_id(crawler) -> str:
    """The id of the node running *crawler* (the same for all its components)."""
    try:
        return _ids[crawler]
    except KeyError:
        ident = _ids[crawler] = new_node_id(crawler.settings)
        return ident
