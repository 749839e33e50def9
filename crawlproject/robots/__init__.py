"""robots.txt for the cluster: one fetch per site, shared through Redis.

Scrapy's ``RobotsTxtMiddleware`` fetches a site's robots.txt in every process,
outside the scheduler: with the shared frontier, every node would fetch it, and
none of those fetches would count against the site's interval and
concurrency. Here one node asks the frontier for it (a request like any
other, under the site's politeness limits), the answer is kept in Redis with
an expiry (RFC 9309), and every node reads it from there; a site's pages wait
in the frontier until it is known. Without ``FRONTIER_SECRET`` nothing stored
can be proven, and each node fetches robots.txt itself.

robots.txt is read as RFC 9309 says: redirects followed (up to five, across
hosts and schemes, each hop under its own site's politeness) with the rules
reached kept for the original site, 4xx allow all, 429/5xx/no answer hold the
site (its last rules serve meanwhile, up to 30 days) and it is fetched again
with a growing backoff, at most 500 KiB read, waits bounded in seconds.

* :mod:`.record` — the stored record, signed by the node that fetched it for
  its site (strict decoding: it is read from Redis);
* :mod:`.rules` — what a robots.txt means for this crawler (its groups and
  ``*``, normalised, a bounded number of rules), and ``Content-Encoding``
  undone within a limit;
* :mod:`.body` — a robots.txt download stopped at 500 KiB, decoded no further;
* :mod:`.hops` — a robots.txt's redirects, each a request a node signed;
* :mod:`.store` — the records, fetch locks and index in Redis;
* :mod:`.middleware` — :class:`ClusterRobotsTxtMiddleware`, the drop-in
  replacement for Scrapy's middleware.
"""

from crawlproject.robots.middleware import ClusterRobotsTxtMiddleware
from crawlproject.robots.record import (RobotsRecord, UnprovenRecord, decode_record,
                                        encode_record)

__all__ = ["ClusterRobotsTxtMiddleware", "RobotsRecord", "UnprovenRecord", "decode_record",
           "encode_record"]
