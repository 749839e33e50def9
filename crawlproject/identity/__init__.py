"""Browser identity: what a site sees as one visitor, the same on every node.

A session (an explicit ``meta["session"]``, else the proxy, else the site)
gets one User-Agent with the headers that browser sends, and one cookie jar
shared across nodes. The modules:

* :mod:`~crawlproject.identity.session`: what the downloader middlewares
  (identity, proxy, cookies, rendering) agree on in ``request.meta``;
* :mod:`~crawlproject.identity.useragents`: identities and the header tables
  per browser (client hints), no Scrapy;
* :mod:`~crawlproject.identity.middleware`: ``IdentityMiddleware`` (610);
* :mod:`~crawlproject.identity.cookies`: ``SessionCookiesMiddleware`` (690)
  and ``SessionCookiesSpiderMiddleware`` (650), cookies per session.

The node's own id is :mod:`crawlproject.node`. It lived at this path before
(``crawlproject.identity.node_id``), so its names are still importable from
here; new code imports them from :mod:`crawlproject.node`.
"""

from crawlproject.node import new_node_id, node_id, node_name

__all__ = ["new_node_id", "node_id", "node_name"]
