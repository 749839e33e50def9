"""Where requests may go: the address policy every connection of a node obeys.

* :mod:`~crawlproject.egress.policy`: ``DOWNLOAD_ALLOWED_NETWORKS`` and the
  address classes (no Scrapy, no Twisted);
* :mod:`~crawlproject.egress.resolver`: ``GuardedResolver``, the reactor's name
  resolver that drops refused addresses, installed by the scheduler (or as
  ``TWISTED_DNS_RESOLVER``);
* :mod:`~crawlproject.egress.report`: ``AddressRefused``, stats, log lines and
  dead letters of refused requests;
* :mod:`~crawlproject.egress.middleware`: ``EgressMiddleware`` (downloader),
  IP-literal URLs and proxies refused before any connection;
* :mod:`~crawlproject.egress.browser`: the forward proxy Chromium's every
  request goes through.

See docs/frontier.md, "Where requests may go".
"""

from crawlproject.egress.policy import AddressPolicy, Refusal

__all__ = ["AddressPolicy", "Refusal"]
