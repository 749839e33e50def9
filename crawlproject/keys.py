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
                                           and per layer i: cap/p/k/bits/shards/n
``{<spider>}:bloom:<i>:<s>``       string  bits of shard s of layer i
``{<spider>}:dupefilter``          hash    (standalone ``RedisBloomDupeFilter`` for
                                           scrapy-redis' scheduler: same layout as
                                           ``bloom``, bits in ``...:dupefilter:<i>:<s>``)
=================================  ======  ==========================================

Nothing in these keys is ever unpickled. One node closing never deletes them;
:func:`reset_spider` (``python -m crawlproject.cli reset``) is the explicit reset.
"""

from __future__ import annotations

from dataclasses import dataclass

START_URLS = "%(spider)s:start_urls"
START_URLS_INVALID = "%(spider)s:start_urls:invalid"


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
    def dupefilter(self) -> str: return self._k("dupefilter")

    def sync_keys(self) -> list[str]:
        """KEYS of the SYNC script, in its order."""
        return [self.queue, self.payloads, self.inflight, self.nodes, self.delayed,
                self.dead, self.invalid, self.seq, self.bloom]


def reset_spider(client, spider: str, keep_seeds: bool = False) -> int:
    """Delete the shared state of *spider* (frontier, filter, and seeds unless kept).

    Returns how many keys were deleted. Works on a single Redis and on a
    Redis Cluster (the cluster client scans every master).
    """
    keep = {START_URLS % {"spider": spider}} if keep_seeds else set()
    deleted = 0
    for pattern in (f"{spider}:*", f"{{{spider}}}:*"):
        for key in client.scan_iter(match=pattern, count=1000):
            name = key.decode() if isinstance(key, bytes) else key
            if name not in keep:
                deleted += client.delete(name)
    return deleted
