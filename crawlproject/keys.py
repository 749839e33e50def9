"""Every Redis key the project uses, in one place: the names (hash tags,
partitions, derived keys) are built here and nowhere else.

The layout, each key's type, contents and writer: docs/frontier.md, "Redis keys".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Default of ``REDIS_START_URLS_KEY`` (scrapy-redis' name and pattern).
START_URLS = "%(name)s:start_urls"
#: Default of ``DUPEFILTER_KEY`` for the standalone dupefilter.
DUPEFILTER = "{%(spider)s}:dupefilter"


def start_urls_key(spider: str, pattern: str | None = None) -> str:
    """The seed key of *spider* (``REDIS_START_URLS_KEY`` pattern, default :data:`START_URLS`)."""
    return (pattern or START_URLS) % {"name": spider, "spider": spider}


def bloom_shard_key(meta_key: str, layer: int, shard: int) -> str:
    """The string holding shard *shard* of layer *layer* of the filter at *meta_key*."""
    return f"{meta_key}:{layer}:{shard}"


def has_hash_tag(key: str) -> bool:
    """True when *key* has a Redis Cluster hash tag (a non-empty ``{...}``)."""
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    return start >= 0 and end > start + 1


@dataclass(frozen=True)
class SeedKeys:
    """The keys of one seed key (``<spider>:start_urls`` by default)."""

    key: str

    @property
    def seeds(self) -> str: return self.key
    @property
    def invalid(self) -> str: return f"{self.key}:invalid"
    @property
    def _tag(self) -> str: return f"{{{self.key}}}"
    @property
    def claims(self) -> str: return f"{self._tag}:claims"
    @property
    def claims_due(self) -> str: return f"{self._tag}:claims:due"
    @property
    def claims_seq(self) -> str: return f"{self._tag}:claims:seq"
    @property
    def sitemap_seeds(self) -> str: return f"{self._tag}:sitemaps"

    def claim_keys(self) -> list[str]:
        """KEYS of the CLAIM_SEEDS script, in its order."""
        return [self.seeds, self.claims, self.claims_due, self.claims_seq]

    def all(self) -> list[str]:
        return [self.seeds, self.invalid, self.claims, self.claims_due, self.claims_seq,
                self.sitemap_seeds]


#: Characters no spider name may hold: ``:`` would make ``{shop:1}`` both spider
#: ``shop:1`` and partition 1 of ``shop`` (a reset of one deleted the other),
#: braces change the hash tag, the rest are SCAN/KEYS glob characters.
SPIDER_NAME_FORBIDDEN = ":{}*?[]\\"


def check_spider_name(name: str) -> str:
    """*name* if its keys cannot collide with another spider's; else ValueError."""
    if not isinstance(name, str) or not name or not name.isprintable() or any(
            c in SPIDER_NAME_FORBIDDEN for c in name):
        raise ValueError(f"spider name {name!r} refused: a name may not be empty nor hold "
                         f"{' '.join(SPIDER_NAME_FORBIDDEN)} or control characters (its Redis "
                         "keys could be another spider's or a partition's)")
    return name


@dataclass(frozen=True)
class FrontierKeys:
    """Concrete key names of one partition of a spider's frontier (the spider
    name is checked: :func:`check_spider_name`)."""

    spider: str
    partition: int = 0
    partitions: int = 1

    def __post_init__(self):
        check_spider_name(self.spider)

    @property
    def tag(self) -> str:
        """The partition's hash tag: ``{spider}``, or ``{spider:p}`` with P > 1."""
        if self.partitions == 1:
            return f"{{{self.spider}}}"
        return f"{{{self.spider}:{self.partition}}}"

    def _k(self, name: str) -> str:
        return f"{self.tag}:{name}"

    @property
    def queue_prefix(self) -> str: return self._k("q")
    def queue(self, key: str) -> str: return f"{self.queue_prefix}:{key}"
    @property
    def ready(self) -> str: return self._k("ready")
    @property
    def qlen(self) -> str: return self._k("qlen")
    @property
    def kstate(self) -> str: return self._k("kstate")
    @property
    def limits(self) -> str: return self._k("limits")
    @property
    def payloads(self) -> str: return self._k("payloads")
    @property
    def inflight(self) -> str: return self._k("inflight")
    @property
    def held_prefix(self) -> str: return self._k("held")
    def held(self, node: str) -> str: return f"{self.held_prefix}:{node}"
    @property
    def nodes(self) -> str: return self._k("nodes")
    @property
    def wanting(self) -> str: return self._k("wanting")

    @property
    def budget(self) -> str: return self._k("budget")
    @property
    def delayed(self) -> str: return self._k("delayed")
    @property
    def dead(self) -> str: return self._k("dead")
    @property
    def invalid(self) -> str: return self._k("invalid")
    @property
    def seq(self) -> str: return self._k("seq")
    @property
    def stats(self) -> str: return self._k("stats")
    @property
    def bloom(self) -> str: return self._k("bloom")
    # The MongoDB tier's bookkeeping (crawlproject/frontier/mover.py).
    @property
    def backlog(self) -> str: return self._k("backlog")
    @property
    def moves(self) -> str: return self._k("moves")
    @property
    def mover(self) -> str: return self._k("mover")
    @property
    def moving_prefix(self) -> str: return self._k("moving")
    def moving(self, key: str) -> str: return f"{self.moving_prefix}:{key}"
    @property
    def refilled_prefix(self) -> str: return self._k("refilled")
    def refilled(self, key: str) -> str: return f"{self.refilled_prefix}:{key}"
    # Spider-wide keys (the same for every partition).
    @property
    def config(self) -> str: return f"{{{self.spider}}}:config"
    @property
    def cluster_stats(self) -> str: return f"{{{self.spider}}}:stats"
    @property
    def dupefilter(self) -> str: return DUPEFILTER % {"spider": self.spider}

    @property
    def recrawl(self) -> str: return f"{{{self.spider}}}:recrawl"

    @property
    def recrawl_lock(self) -> str: return f"{{{self.spider}}}:recrawl:lock"

    def mongo_spool(self, target: str) -> str:
        """The list of spooled items handed over for MongoDB target *target*."""
        return f"{{{self.spider}}}:mongo_spool:{target}"

    def sync_keys(self) -> list[str]:
        """KEYS of the SYNC script, in its order."""
        return [self.ready, self.payloads, self.inflight, self.nodes, self.delayed,
                self.dead, self.invalid, self.seq, self.bloom, self.stats, self.kstate,
                self.limits, self.queue_prefix, self.held_prefix, self.qlen, self.wanting,
                self.budget, self.moves, self.backlog]

    def move_keys(self) -> list[str]:
        """KEYS of the move scripts (CLAIM_MOVES, SPILL_COMMIT, REFILL_COMMIT,
        REFILL_DONE), in their order; each uses some of them (its header says
        which). A key's ``moving``/``refilled`` sets are derived from the
        prefixes, as its queue is from ``queue_prefix``."""
        return [self.mover, self.moves, self.queue_prefix, self.moving_prefix,
                self.refilled_prefix, self.payloads, self.inflight, self.delayed,
                self.backlog, self.kstate, self.ready, self.stats]

    def replay_keys(self) -> list[str]:
        """KEYS of the REPLAY_DEAD script, in its order."""
        return [self.dead, self.payloads, self.seq, self.delayed]

    def fixed(self) -> list[str]:
        """Every key of this partition with a fixed name (not queues, held sets, shards)."""
        return [*self.sync_keys()[:12], self.qlen, self.wanting, self.budget, self.config,
                self.cluster_stats, self.dupefilter, self.backlog, self.moves, self.mover]

    def patterns(self) -> list[str]:
        """SCAN patterns of this partition's derived keys."""
        return [_glob_escape(p) + ":*" for p in (self.queue_prefix, self.held_prefix,
                                                 self.bloom, self.dupefilter)]


@dataclass(frozen=True)
class ProxyKeys:
    """The keys of a spider's shared proxy pool (all under ``{<spider>}``)."""

    spider: str

    @property
    def pool(self) -> str: return f"{{{self.spider}}}:proxies"
    @property
    def health(self) -> str: return f"{{{self.spider}}}:proxy:health"
    @property
    def bans(self) -> str: return f"{{{self.spider}}}:proxy:bans"
    @property
    def retired(self) -> str: return f"{{{self.spider}}}:proxy:retired"
    @property
    def ban_log(self) -> str: return f"{{{self.spider}}}:proxy:banlog"
    @property
    def ban_expiry(self) -> str: return f"{{{self.spider}}}:proxy:banexp"
    @property
    def state(self) -> str: return f"{{{self.spider}}}:proxy:state"

    def refresh_keys(self) -> list[str]:
        """KEYS of the REFRESH script, in its order."""
        return [self.pool, self.health, self.bans, self.retired, self.ban_log,
                self.ban_expiry, self.state]


@dataclass(frozen=True)
class RobotsKeys:
    """The keys of the robots.txt files a spider's nodes share (under ``{<spider>}``)."""

    spider: str

    def record(self, origin: str) -> str:
        """The stored robots.txt of *origin* (``scheme://host[:port]``)."""
        return f"{{{self.spider}}}:robots:{origin}"

    @property
    def index(self) -> str:
        """Host → the last stored record's origin, status, fetched and expires
        (JSON), for ``crawlctl politeness``."""
        return f"{{{self.spider}}}:robots"

    def fetch_lock(self, origin: str) -> str:
        """Held by the node that asked the frontier to fetch *origin*'s robots.txt."""
        return f"{{{self.spider}}}:robots:{origin}:fetch"


@dataclass(frozen=True)
class SitemapKeys:
    """The keys of sitemap seeds (:mod:`crawlproject.sitemaps`)."""

    spider: str
    seed_key: str

    @property
    def pending(self) -> str:
        """Seeds read from sitemaps, not yet in the seed key (its slot)."""
        return SeedKeys(self.seed_key).sitemap_seeds

    @property
    def sites(self) -> str:
        """Host → how many sitemaps were requested for that site."""
        return f"{{{self.spider}}}:sitemaps"


def spider_keys(client, spider: str, seed_key: str | None = None) -> list[str]:
    """Every key of *spider* that exists: seeds and their claims, every
    partition of the frontier (whatever the partition count), both Bloom
    filters and their shards, handed-over items."""
    seeds = SeedKeys(seed_key or start_urls_key(spider))
    found = {k for k in seeds.all() if client.exists(k)}
    base = FrontierKeys(spider)
    found.update(k for k in base.fixed() if client.exists(k))
    # {spider}:... and the partitions' {spider:<digits>}:... (never another spider's)
    patterns = [_glob_escape(f"{{{spider}}}:") + "*", _glob_escape(f"{{{spider}:") + "[0-9]*}:*"]
    # the glob's [0-9]* also matches {spider:1x}: and {spider:1:2}: (not partitions)
    exact = re.compile(re.escape(f"{{{spider}") + r"(?::[0-9]+)?\}:", re.DOTALL)
    for pattern in patterns:
        found.update(k for k in map(_s, client.scan_iter(match=pattern, count=1000))
                     if exact.match(k))
    return sorted(found)


def spooled_item_keys(client, spider: str) -> list[str]:
    """The ``mongo_spool`` lists of *spider* that exist (items not yet in MongoDB)."""
    pattern = _glob_escape(FrontierKeys(spider).mongo_spool("")) + "*"
    return [_s(k) for k in client.scan_iter(match=pattern, count=1000)]


def reset_spider(client, spider: str, keep_seeds: bool = False,
                 seed_key: str | None = None, keep_proxy_pool: bool = True) -> int:
    """Delete the shared state of *spider*: frontier, filters, seed claims and
    invalid seeds, proxy health and bans, and the seeds themselves unless
    *keep_seeds*. The operator's proxy list (``{spider}:proxies``, with its
    credentials) is configuration, not crawl state: kept unless not
    *keep_proxy_pool*.

    Returns how many keys were deleted. Works on a single Redis and on a
    Redis Cluster (the cluster client scans every master). Only the spider's
    own keys are touched (no pattern can match another spider's keys).
    """
    seeds = SeedKeys(seed_key or start_urls_key(spider))
    deleted = 0
    for key in spider_keys(client, spider, seed_key):
        if keep_seeds and key == seeds.seeds:
            continue
        if keep_proxy_pool and key == ProxyKeys(spider).pool:
            continue
        deleted += client.delete(key)
    return deleted


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def as_text(value) -> str:
    """A value read from Redis as text (bytes decoded as UTF-8, bad bytes
    replaced: the data is untrusted and must not stop whoever reads it)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


_s = as_text
