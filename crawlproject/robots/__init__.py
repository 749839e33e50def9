"""robots.txt for the cluster: one fetch per site, shared through Redis.

Scrapy's ``RobotsTxtMiddleware`` fetches a site's robots.txt in every process,
outside the scheduler: with the shared frontier, every node would fetch it, and
none of those fetches would count against the site's interval and
concurrency. Here one node asks the frontier for it (a request like any
other, under the site's politeness limits), the answer is kept in Redis with
an expiry (RFC 9309), and every node reads it from there; a site's pages wait
in the frontier until it is known. Without ``FRONTIER_SECRET`` nothing stored
can be proven, and each node fetches robots.txt itself.

* :mod:`.record` — the stored record, signed by the node that fetched it for
  its site (strict decoding: it is read from Redis);
* :mod:`.middleware` — :class:`ClusterRobotsTxtMiddleware`, the drop-in
  replacement for Scrapy's middleware.
"""

from crawlproject.robots.middleware import ClusterRobotsTxtMiddleware
from crawlproject.robots.record import (RobotsRecord, UnprovenRecord, decode_record,
                                        encode_record)

__all__ = ["ClusterRobotsTxtMiddleware", "RobotsRecord", "UnprovenRecord", "decode_record",
           "encode_record"]
