"""What a request looks like on its way out: its session (proxy, identity,
cookie jar), agreed on by the downloader middlewares through ``request.meta``."""
