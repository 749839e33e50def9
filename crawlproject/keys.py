"""Every Redis key the project uses, in one place.

Frontier keys carry the hash tag ``{<spider>}`` so that every multi-key script
runs on one Redis Cluster slot. Seed keys keep scrapy-redis' names, which
users already push to; they are only touched by single-key commands.

=================================  ======  ==========================================
key                                type    contents / written by
=================================  ======  ==========================================
``<spider>:start_urls``            list    seeds (plain URL or JSON); users push,
                                   (set,   ``RedisSpider.start()`` pops in batches
                                   zset)   (``REDIS_START_URLS_AS_SET`` / ``_AS_ZSET``)
``<spider>:start_urls:invalid``    list    rejected seeds ``{seed, reason, error, node,
                                           at}``; ``RedisSpider``
``{<spider>:start_urls}:claims``   hash    claim id → seed taken but whose requests are
                                           not yet in the frontier (zset seeds stored
                                           as ``"<score>\n<seed>"``); CLAIM_SEEDS
``{<spider>:start_urls}:claims:due`` zset  claim id → deadline (ms); expired claims are
                                           put back by the next CLAIM_SEEDS
``{<spider>:start_urls}:claims:seq`` string claim id counter
``{<spider>}:queue``               zset    member ``"<priority>:<seq>"``, score
                                           ``-priority*2^40 + seq``; SYNC script
``{<spider>}:payloads``            hash    member → request JSON
                                           (:mod:`crawlproject.serialization`); SYNC
``{<spider>}:inflight``            hash    member → node id holding its lease; SYNC
``{<spider>}:nodes``               zset    node id → lease deadline (ms, Redis time);
                                           every SYNC of that node renews it
``{<spider>}:delayed``             zset    member → due time (ms): retries waiting
                                           out their backoff; SYNC
``{<spider>}:dead``                list    dead letters ``{member, payload, priority,
                                           url, reason, attempts, node, at}``; SYNC,
                                           replayed by REPLAY_DEAD
``{<spider>}:invalid``             list    payloads that could not be decoded
                                           ``{member, payload, reason, node, at}``
``{<spider>}:seq``                 string  entry counter (FIFO order); SYNC
``{<spider>}:stats``               hash    cluster-wide counters (enqueued, duplicates,
                                           acked, dead, reclaimed, ...) that nodes add
                                           every ``SCHEDULER_LOG_INTERVAL`` and at close
``{<spider>}:bloom``               hash    Bloom layer table: capacity, error_rate,
                                           growth, tightening, shard_bits, layers,
                                           and per layer i: cap/p/k/bits/shards/n;
                                           ahead = shards of the next layer made
                                           before it opens
``{<spider>}:bloom:<i>:<s>``       string  bits of shard s of layer i (i = layers
                                           for shards made ahead)
``{<spider>}:dupefilter``          hash    (standalone ``RedisBloomDupeFilter`` for
                                           scrapy-redis' scheduler: same layout as
                                           ``bloom``, bits in ``...:dupefilter:<i>:<s>``)
``{<spider>}:mongo_spool:<target>`` list   items a node could not store in MongoDB
                                           before closing: chunks of spool lines;
                                           ``<target>`` = ``<database>-<hash of hosts>``;
                                           RPUSHed by the closing node, any node removes
                                           a chunk (LREM) after writing it
                                           (:mod:`crawlproject.pipelines.handoff`)
=================================  ======  ==========================================

Derived keys: a Bloom filter's shards are ``<meta key>:<layer>:<shard>``
(:func:`bloom_shard_key`); they share the meta key's hash tag, so a script
that is given the meta key in KEYS touches only keys of its slot.

Nothing in these keys is ever unpickled. One node closing never deletes them;
:func:`reset_spider` (``python -m crawlproject.cli reset``) is the explicit reset:
it deletes every key of the spider. (The command line refuses while
``mongo_spool`` lists hold items not yet in MongoDB, unless told to drop them.)
"""

from __future__ import annotations

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

    def claim_keys(self) -> list[str]:
        """KEYS of the CLAIM_SEEDS script, in its order."""
        return [self.seeds, self.claims, self.claims_due, self.claims_seq]

    def all(self) -> list[str]:
        return [self.seeds, self.invalid, self.claims, self.claims_due, self.claims_seq]


@dataclass(frozen=True)
class FrontierKeys:
    """Concrete key names of one spider's frontier."""

    spider: str

    def _k(self, name: str) -> str:
        return f"{{{self.spider}}}:{name}"

    @property
    def queue(self) -> str: return self._k("queue")
    @property
    def payloads(self) -> str: return self._k("payloads")
    @property
    def inflight(self) -> str: return self._k("inflight")
    @property
    def nodes(self) -> str: return self._k("nodes")
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
    @property
    def dupefilter(self) -> str: return DUPEFILTER % {"spider": self.spider}

    def mongo_spool(self, target: str) -> str:
        """The list of spooled items handed over for MongoDB target *target*."""
        return self._k(f"mongo_spool:{target}")

    def sync_keys(self) -> list[str]:
        """KEYS of the SYNC script, in its order."""
        return [self.queue, self.payloads, self.inflight, self.nodes, self.delayed,
                self.dead, self.invalid, self.seq, self.bloom, self.stats]

    def replay_keys(self) -> list[str]:
        """KEYS of the REPLAY_DEAD script, in its order."""
        return [self.dead, self.queue, self.payloads, self.seq]

    def fixed(self) -> list[str]:
        """Every key of the frontier except Bloom shards (see :func:`bloom_shard_key`)."""
        return [*self.sync_keys(), self.dupefilter]


def spider_keys(client, spider: str, seed_key: str | None = None) -> list[str]:
    """Every key of *spider* that exists: seeds and their claims, the frontier,
    both Bloom filters and their shards."""
    seeds = SeedKeys(seed_key or start_urls_key(spider))
    frontier = FrontierKeys(spider)
    candidates = [*seeds.all(), *frontier.fixed()]
    found = [k for k in candidates if client.exists(k)]
    for meta in (frontier.bloom, frontier.dupefilter):
        pattern = _glob_escape(meta) + ":*"
        found += [_s(k) for k in client.scan_iter(match=pattern, count=1000)]
    return found + spooled_item_keys(client, spider)


def spooled_item_keys(client, spider: str) -> list[str]:
    """The ``mongo_spool`` lists of *spider* that exist (items not yet in MongoDB)."""
    pattern = _glob_escape(FrontierKeys(spider).mongo_spool("")) + "*"
    return [_s(k) for k in client.scan_iter(match=pattern, count=1000)]


def reset_spider(client, spider: str, keep_seeds: bool = False,
                 seed_key: str | None = None) -> int:
    """Delete the shared state of *spider*: frontier, filters, seed claims and
    invalid seeds, and the seeds themselves unless *keep_seeds*.

    Returns how many keys were deleted. Works on a single Redis and on a
    Redis Cluster (the cluster client scans every master). Only the spider's
    own keys are touched (no pattern can match another spider's keys).
    """
    seeds = SeedKeys(seed_key or start_urls_key(spider))
    deleted = 0
    for key in spider_keys(client, spider, seed_key):
        if keep_seeds and key == seeds.seeds:
            continue
        deleted += client.delete(key)
    return deleted


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
