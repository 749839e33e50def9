"""crawlctl dashboard: the web dashboard (:mod:`crawlproject.dashboard`)."""

from __future__ import annotations


from crawlproject.ops.common import UsageError, current_project


def cmd_dashboard(args) -> int:
    """The live dashboard in the browser (crawlproject/dashboard): every spider
    named, else every spider of the project."""
    from crawlproject.dashboard import DashboardConfig
    from crawlproject.dashboard.auth import Credentials
    from crawlproject.dashboard.server import run

    spiders = list(dict.fromkeys(args.spiders))
    if not spiders:
        _, loader = current_project()
        spiders = sorted(loader.list()) if loader is not None else []
    if not spiders:
        raise UsageError("name the spider(s) to show: no Scrapy project here")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0 to 65535, got {args.port}")
    if args.interval <= 0 or args.window < args.interval:
        raise UsageError("--interval must be above 0 and --window at least one interval")
    config = DashboardConfig(spiders, args.redis_url, cluster=args.cluster,
                             credentials=Credentials.from_env(token_file=args.token_file),
                             interval=args.interval, window=args.window)
    return run(config, args.host, args.port)
