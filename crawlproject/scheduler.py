"""RedisScheduler: Scrapy's scheduler over the shared Redis frontier.

The one object Scrapy calls as its scheduler (``enqueue_request``,
``next_request``, ``has_pending_requests``, ``open``/``close``): it turns
requests into stored payloads and back, and acknowledges each request once it
has left the engine. The node's sync loop with Redis is
:mod:`crawlproject.frontier.client`; the scheduler's other parts are in
:mod:`crawlproject.scheduling`. How it works: docs/frontier.md, "The Scrapy
adapter".
"""

from __future__ import annotations

import logging
from functools import partial

from scrapy import Request, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.utils.defer import deferred_from_coro

from crawlproject.connection import (redact_url, redis_from_settings,
                                     redis_url_from_settings)
from crawlproject import defaults
from crawlproject.defaults import setting
from crawlproject.egress.resolver import install_guard
from crawlproject.frontier.bloom import BloomConfig
from crawlproject.frontier.client import FrontierClient, Rejected
from crawlproject.frontier.movertask import MoverTask
from crawlproject.scheduling.burst import StartBurst, default_prefetch
from crawlproject.scheduling.engineguards import (SUPPORTED_SCRAPY, check_engine,
                                                  log_trust, no_local_politeness,
                                                  no_remote_control, per_node_robots)
from crawlproject.scheduling.compat import idle_before_close, scrapy_redis_notes
from crawlproject.scheduling.errback import LeaseErrback
from crawlproject.scheduling.failures import Failures
from crawlproject.scheduling.limits import (HOST_LIMITS_REFRESH, LIMITS_CHUNK,
                                            LimitsPublisher)
from crawlproject.scheduling.local import LocalRequests, local_slot, strip_slot
from crawlproject.scheduling.nodecontrol import NodeControl
from crawlproject.scheduling.recent import RecentlySent
from crawlproject.scheduling.report import NodeReport
from crawlproject.scheduling.sitepoliteness import SitePoliteness
from crawlproject.scheduling.sitefeedback import SiteFeedback
from crawlproject.scheduling.startstate import StartState
from crawlproject.control import ControlWatcher
from crawlproject.hooks import ACK, RELEASED, RETRY, request_hooks
from crawlproject.frontier.queue import DEAD_MAX, INVALID_MAX, MAX_PRIORITY, AsyncFrontier
from crawlproject.frontier.retrypolicy import (
    CALLBACK_ATTEMPTS_META,
    LEASE_META,
    PARENT_META,
    PAYLOAD_META,
    RETRY_DELAY_META,
    SLOW_DOWN_META,
    RetryPolicy,
)
from crawlproject.node import node_id
from crawlproject.outage import outage_log
from crawlproject.policy import InputPolicy
from crawlproject.serialization import (
    RequestDecodeError,
    RequestEncodeError,
    load_request,
    node_storable,
    request_to_json,
)
from crawlproject.signing import Signer, signer_from_settings
from crawlproject.urls import UrlCanonicalizer, canonicalizer_for

logger = logging.getLogger(__name__)

__all__ = ["RedisScheduler", "LEASE_META", "RETRY_DELAY_META", "CALLBACK_ATTEMPTS_META",
           "SUPPORTED_SCRAPY", "HOST_LIMITS_REFRESH", "LIMITS_CHUNK"]


class RedisScheduler(BaseScheduler):
    """Scheduler shared by every node through Redis (see module docstring)."""

    def __init__(self, crawler, *, prefetch: int, batch_size: int, flush_interval: float,
                 min_sync_interval: float, idle_poll: float, local_dedupe_size: int,
                 lease_ttl: float, heartbeat: float, bloom: BloomConfig,
                 retry: RetryPolicy, politeness: SitePoliteness, node_id: str,
                 dead_max: int = DEAD_MAX, invalid_max: int = INVALID_MAX,
                 start_burst: int = 0, idle_poll_max: float = defaults.SCHEDULER_IDLE_POLL_MAX,
                 control_on_start: str = defaults.CONTROL_ON_START,
                 idle_before_close: float = 0.0):
        if start_burst < 0:
            raise ValueError(f"SCHEDULER_START_BURST ({start_burst}) must be 0 (no limit) or "
                             "more (requests handed to the engine per event-loop turn)")
        if heartbeat <= 0 or heartbeat >= lease_ttl:
            raise ValueError(f"SCHEDULER_HEARTBEAT_INTERVAL ({heartbeat}s) must be above 0 and "
                             f"well under SCHEDULER_LEASE_TTL ({lease_ttl}s)")
        self.crawler = crawler
        self.stats = crawler.stats
        self.fingerprinter = crawler.request_fingerprinter
        self.prefetch, self.batch_size = prefetch, batch_size
        self.flush_interval, self.min_sync_interval = flush_interval, min_sync_interval
        self.idle_poll, self.lease_ttl, self.heartbeat = idle_poll, lease_ttl, heartbeat
        self.idle_poll_max = idle_poll_max
        self.local_dedupe_size = local_dedupe_size
        #: the local dedupe: what this node sent most recently
        self.recent = RecentlySent(local_dedupe_size, self.fingerprinter)
        self.bloom = bloom
        self.retry = retry
        #: every request's URL in its canonical form (crawlproject/urls.py), shared
        #: with the seed reader and robots.txt through the crawler
        self.urls: UrlCanonicalizer = canonicalizer_for(crawler)
        self.politeness = politeness
        self.node = node_id
        self.dead_max, self.invalid_max = dead_max, invalid_max
        self.spider = None
        self.policy: InputPolicy | None = None
        #: proves what this crawl's nodes stored (None: FRONTIER_SECRET not set)
        self.signer: Signer | None = None
        self.client: FrontierClient | None = None
        self.local: LocalRequests | None = None
        self._redis_url = redis_url_from_settings(crawler.settings)
        self._redis_outage = outage_log(crawler, "redis", f"Redis at {redact_url(self._redis_url)}")
        self._warned_priority = False
        self._scraping: set[str] = set()
        # Counts of the per-request path, added to the stats by flush_counts()
        # (every loop turn and at close): Scrapy 2.19's inc_value costs ~1.7 us
        # through its deprecation wrappers, and a page made up to 11 of them.
        self._filtered_locally = self._enqueued = self._dequeued = self._unproven = 0
        self.report_interval = setting(crawler.settings, "SCHEDULER_LOG_INTERVAL")
        self.control_interval = setting(crawler.settings, "CONTROL_POLL_INTERVAL")
        #: the operator's state found at start (CONTROL_ON_START: wait or exit)
        self.start_state = StartState("", control_on_start)
        # Its parts (crawlproject.scheduling), set up at open with the frontier client:
        #: the node's report, its cluster-wide counts and the Frontier line
        self.report: NodeReport | None = None
        #: the operator's state applied to this node, and its ControlWatcher
        self.node_control: NodeControl | None = None
        self.control: ControlWatcher | None = None
        #: FRONTIER_HOST_LIMITS published to Redis and kept there
        self.limits: LimitsPublisher | None = None
        #: what sites answer, told to every node
        self.site_feedback: SiteFeedback | None = None
        #: failed requests, retried or dead-lettered once they leave the engine
        self.failures: Failures | None = None
        #: request lifecycle hooks (crawlproject.hooks), read at open
        self.hooks: list = []
        self.start_burst = StartBurst(start_burst, self._nudge_engine)
        #: seconds a node whose crawl is done waits before closing (scrapy-redis'
        #: SCHEDULER_IDLE_BEFORE_CLOSE)
        self.idle_before_close = idle_before_close

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        concurrency = s.getint("CONCURRENT_REQUESTS")
        return cls(
            crawler,
            prefetch=setting(s, "SCHEDULER_PREFETCH") or default_prefetch(concurrency),
            batch_size=setting(s, "SCHEDULER_BATCH_SIZE"),
            flush_interval=setting(s, "SCHEDULER_FLUSH_INTERVAL"),
            min_sync_interval=setting(s, "SCHEDULER_MIN_SYNC_INTERVAL"),
            local_dedupe_size=setting(s, "SCHEDULER_LOCAL_DEDUPE_SIZE"),
            idle_poll=setting(s, "SCHEDULER_IDLE_POLL"),
            idle_poll_max=setting(s, "SCHEDULER_IDLE_POLL_MAX"),
            lease_ttl=setting(s, "SCHEDULER_LEASE_TTL"),
            heartbeat=setting(s, "SCHEDULER_HEARTBEAT_INTERVAL"),
            bloom=BloomConfig.from_settings(s),
            retry=RetryPolicy.from_settings(s),
            politeness=SitePoliteness.from_settings(s),
            node_id=node_id(crawler),
            dead_max=setting(s, "SCHEDULER_DEAD_MAX"),
            invalid_max=setting(s, "SCHEDULER_INVALID_MAX"),
            # Off by default: it pays only while the event loop has time to
            # spare (see StartBurst); a node that is CPU-bound loses by it.
            start_burst=setting(s, "SCHEDULER_START_BURST"),
            control_on_start=setting(s, "CONTROL_ON_START"),
            idle_before_close=idle_before_close(s),
        )

    # -- Scrapy scheduler interface ------------------------------------------
    def open(self, spider):
        check_engine(self.crawler)
        self.setup(spider)
        if self.politeness.enabled:
            no_local_politeness(self.crawler, self.politeness, {"spider": spider})
        per_node_robots(self.crawler, {"spider": spider})
        install_guard(self.crawler)   # DOWNLOAD_ALLOWED_NETWORKS for every connection (egress/)
        self.crawler.signals.connect(self._on_response, signal=signals.response_received)
        feedback = self.site_feedback
        self.crawler.signals.connect(feedback.on_left_downloader,
                                     signal=signals.request_left_downloader)
        self.crawler.signals.connect(feedback.on_downloaded, signal=signals.response_downloaded)
        self.crawler.signals.connect(feedback.on_reached_downloader,
                                     signal=signals.request_reached_downloader)
        self.crawler.signals.connect(self.failures.on_spider_error, signal=signals.spider_error)
        self.crawler.signals.connect(feedback.on_robots, signal=signals.robots_parsed)
        self.crawler.signals.connect(self.node_control.on_spider_opened,
                                     signal=signals.spider_opened)
        self.crawler.signals.connect(self.node_control.on_spider_idle,
                                     signal=signals.spider_idle)
        pol = self.politeness
        logger.info("Shared frontier for %r on %s as node %s (prefetch %d, %s starts a loop "
                    "turn, lease %ss, heartbeat %ss, %d partition(s); politeness per %s %s)",
                    spider.name, redact_url(self._redis_url), self.node, self.prefetch,
                    self.start_burst.size or "unlimited", self.lease_ttl,
                    self.heartbeat, pol.partitions, pol.key_mode,
                    f"cluster-wide: {pol.default.delay:g}s between starts, at most "
                    f"{pol.default.concurrency} in flight" if pol.enabled else "off",
                    extra={"spider": spider})
        log_trust(self.signer, self.stats, {"spider": spider})
        for level, message in scrapy_redis_notes(self.crawler.settings):
            logger.log(level, message, extra={"spider": spider})
        # Nothing is taken before the operator's state is known (NodeControl.ready).
        self.client.paused = True
        self.client.start()
        self.control.start()
        return None

    def setup(self, spider) -> None:
        """Everything :meth:`open` does that needs neither the engine nor Redis."""
        self.spider = spider
        no_remote_control(self.crawler, {"spider": spider})
        self.hooks = request_hooks(self.crawler)
        self.policy = InputPolicy.from_settings(self.crawler.settings, type(spider))
        self.signer = signer_from_settings(self.crawler.settings, spider.name)
        redis = redis_from_settings(self.crawler.settings, asyncio=True)
        parts = self.politeness.partitions
        # Each partition's Bloom filter holds the URLs of its keys: plan a share.
        bloom = self.bloom if parts == 1 else BloomConfig(
            capacity=max(1, self.bloom.capacity // parts), error_rate=self.bloom.error_rate,
            growth=self.bloom.growth, tightening=self.bloom.tightening,
            shard_bits=self.bloom.shard_bits)
        frontiers = [AsyncFrontier(redis, spider.name, self.node, lease_ttl=self.lease_ttl,
                                   bloom=bloom, dead_max=self.dead_max,
                                   invalid_max=self.invalid_max, partition=p, partitions=parts,
                                   politeness=self.politeness)
                     for p in range(parts)]
        extra = {"spider": spider}
        self.report = NodeReport(self.stats, self.report_interval, extra)
        self.client = FrontierClient(
            frontiers, self.politeness, accept=self._accept, before_tick=self._collect_done,
            count=self.report.count, outage=self._redis_outage, log_extra=extra,
            prefetch=self.prefetch, batch_size=self.batch_size,
            flush_interval=self.flush_interval, min_sync_interval=self.min_sync_interval,
            idle_poll=self.idle_poll, heartbeat=self.heartbeat, lease_ttl=self.lease_ttl,
            nudge=self._nudge_engine, free_slots=self._free_slots,
            idle_poll_max=self.idle_poll_max)
        self._setup_backlog(spider, frontiers, extra)
        self.start_state.spider = spider.name
        self.node_control = NodeControl(
            self.crawler, self.client, self.start_state, redis=redis,
            interval=self.control_interval, report=self._node_report, node=self.node,
            partitions=parts, idle_before_close=self.idle_before_close,
            nudge=self._nudge_engine, downloading=lambda: self.downloading,
            has_pending=self.has_pending_requests, log_extra=extra)
        self.control = self.node_control.watcher
        self.limits = LimitsPublisher(self.client, self.politeness, self.stats,
                                      stop=self.node_control.stop, log_extra=extra)
        self.client.on_first_sync = self.limits.first_sync
        self.client.budgets.idle_close = getattr(spider, "max_idle_time", None)  # said when spent
        self.site_feedback = SiteFeedback(self.client, self.politeness, self.stats,
                                          SiteFeedback.robots_agent(self.crawler.settings))
        self.failures = Failures(self.client, self.politeness, self.retry, self.report.count,
                                 spider=spider, policy=self.policy, signer=self.signer)
        # A lease given back unstarted ends for the hooks (a tracing span) too.
        self.client.on_returned = lambda entry: (
            self._settled(entry.item, entry.member, RELEASED) if self.hooks else None)
        self.local = LocalRequests(
            mark_seen=lambda p, fps: self.client.partitions[p].mark_seen(fps),
            partition_of=self.client.partition_of,
            slot_for=partial(local_slot, self.crawler, self.politeness),
            count=self.report.count, nudge=self._nudge_engine, log_extra=extra)

    def _setup_backlog(self, spider, frontiers, extra) -> None:
        """The MongoDB tier (issue 49): SYNC flags keys with the window rule,
        the node's mover moves them (FRONTIER_BACKLOG_ENABLED: both or neither)."""
        settings = self.crawler.settings
        mover = MoverTask.from_settings(
            settings, frontiers, spider.name, self.node,
            default_delay=self.politeness.default.delay, poll=self.heartbeat,
            stats=self.stats, log_extra=extra, on_moved=self.client.moved)
        if mover is None:
            logger.info("Frontier backlog off (FRONTIER_BACKLOG_ENABLED): every queued "
                        "request stays in Redis", extra=extra)
            return
        for frontier in frontiers:
            frontier.window = mover.rule
        self.client.mover = mover
        rule = mover.rule
        logger.info("Frontier backlog on: above %d entries queued in a partition's Redis, a "
                    "site's entries beyond its window (%gs at its pace, %d-%d entries) wait in "
                    "MongoDB (database %r, collection %r)", rule.spill_above, rule.seconds,
                    rule.minimum, rule.maximum, setting(settings, "MONGO_DATABASE"),
                    setting(settings, "FRONTIER_BACKLOG_COLLECTION"), extra=extra)

    def close(self, reason: str):
        return deferred_from_coro(self._close(reason))

    def has_pending_requests(self) -> bool:
        return self.client is not None and (self.client.has_pending() or self.local.pending())

    def enqueue_request(self, request: Request) -> bool:
        try:
            return self._enqueue(request)
        except Exception:  # never into the engine: it would stop reading start()
            logger.exception("Cannot enqueue %s", request, extra={"spider": self.spider})
            self.stats.inc_value("scheduler/enqueue_errors")
            return False

    def _enqueue(self, request: Request) -> bool:
        recent = self.recent
        url_key = recent.url_key(request)
        if recent.sent(url_key):   # a canonical URL this node sent: no more work
            self._filtered_locally += 1
            return False
        # One URL a page, one host a site: what is fetched, fingerprinted, keyed
        # for politeness and robots.txt, logged and stored (no credentials).
        canonical = self.urls.request(request)
        if canonical is not request:
            request, url_key = canonical, recent.url_key(canonical)
            if recent.sent(url_key):
                self._filtered_locally += 1
                return False
        strip_slot(request)
        member = request.meta.pop(LEASE_META, None)
        parent = request.meta.pop(PARENT_META, None)
        retried = RETRY_DELAY_META in request.meta
        delay = request.meta.pop(RETRY_DELAY_META, 0)
        request.meta.pop(SLOW_DOWN_META, None)
        fp = None if request.dont_filter else self.fingerprinter.fingerprint(request)
        if fp is not None and recent.seen(fp):
            # This node already sent it: the shared filter has it (or will have
            # it with the pending call); skip the encoding and the round trip.
            self._filtered_locally += 1
            return False
        try:
            payload = request_to_json(request, self.spider, self.policy, self.signer)
        except RequestEncodeError as exc:
            if fp is not None:
                recent.remember(fp, url_key)
            self._keep_local(request, fp, member, exc)
            return True
        if fp is not None:
            recent.remember(fp, url_key)
        if abs(request.priority) > MAX_PRIORITY:
            self._priority_clamped(request)
        replaces = (member is not None and member in self.client.held
                    and member not in self._scraping)
        if replaces:
            parent = member  # its ack waits for this one, not for every add before it
        elif parent is not None and parent not in self.client.held:
            parent = None    # not ours (any more): this add keeps the wait for everything
        unfiltered = False
        if fp is None and not (replaces or retried or request.meta.get("recrawl")
                               or request.meta.get("robotstxt_fetch")):
            # A new page not deduplicated (a seed, dont_filter): queued, counted
            # for budgets, and its fingerprint recorded, so that a link back to
            # it (a start URL linked from its own pages) is not fetched again.
            fp, unfiltered = self.fingerprinter.fingerprint(request), True
            recent.remember(fp, url_key)
        self.client.add(payload, fp, request.priority, int(delay * 1000),
                        self.politeness.key(request), parent=parent, unfiltered=unfiltered)
        if replaces:
            # A downloader middleware (redirect, retry) replaced a leased request:
            # the old entry is done once the new one is stored (the client sends
            # the ack after it).
            replaced = self.client.held[member].item
            self.client.ack(member, relieve=False)
            if self.hooks:
                self._settled(replaced, member, RETRY if retried else ACK)
        self._enqueued += 1
        return True

    def _keep_local(self, request: Request, fp, member: str | None,
                    exc: RequestEncodeError) -> None:
        """*request* cannot be stored: crawled by this node (see scheduling/local.py)."""
        if self.signer is None and node_storable(request, self.spider):
            code = "no_secret"
            reason = (f"FRONTIER_SECRET is not set, and anyone else may not store this "
                      f"request: {exc}")
        else:
            code, reason = "not_storable", str(exc)
        self.local.keep(request, fp, self.politeness.key(request), reason, code)
        if member is not None and member in self.client.held and member not in self._scraping:
            # It replaces a leased request (a redirect, a retry): that one is done.
            replaced = self.client.held[member].item
            self.client.ack(member, relieve=False)
            if self.hooks:
                self._settled(replaced, member, ACK)

    def _priority_clamped(self, request: Request) -> None:
        self.stats.inc_value("scheduler/priority_clamped")
        if not self._warned_priority:
            self._warned_priority = True
            logger.warning("Request priority %d of %s is outside ±%d: queued at ±%d (priorities "
                           "beyond that keep their order only up to the bound; counted in "
                           "scheduler/priority_clamped, not logged again)", request.priority,
                           request, MAX_PRIORITY, MAX_PRIORITY, extra={"spider": self.spider})

    def next_request(self) -> Request | None:
        if not self.start_burst.allow():
            return None
        if self.local.pending() and not self.client.paused:
            buffer = self.client.buffer
            request = self.local.next(buffer[0].priority if buffer else None)
            if request is not None:
                self.start_burst.handed_out()
                return request
        entry = self.client.next()
        if entry is None:
            return None
        self.start_burst.handed_out()
        self._dequeued += 1
        self.node_control.done_since = None
        return entry.item

    def __len__(self) -> int:
        if not self.client:
            return 0
        return self.client.local_backlog() + len(self.local) + self.client.remote_queued()

    def flush_counts(self) -> None:
        """Add the per-request counts kept since the last flush to the stats
        (``dupefilter/filtered``, ``dupefilter/filtered_locally``,
        ``scheduler/enqueued/redis``, ``scheduler/dequeued/redis``)."""
        if self._filtered_locally:
            self.report.count("dupefilter/filtered", self._filtered_locally)
            self.stats.inc_value("dupefilter/filtered_locally", self._filtered_locally)
            self._filtered_locally = 0
        if self._enqueued:
            self.stats.inc_value("scheduler/enqueued/redis", self._enqueued)
            self._enqueued = 0
        if self._dequeued:
            self.stats.inc_value("scheduler/dequeued/redis", self._dequeued)
            self._dequeued = 0
        if self._unproven:
            self.stats.inc_value("scheduler/unproven", self._unproven)
            self._unproven = 0

    def local_backlog(self) -> int:
        """Requests this node holds that Redis has not handed to the engine yet
        (and those it keeps to itself)."""
        return self.client.local_backlog() + len(self.local) if self.client else 0

    def flushed(self):
        """A future that resolves once everything enqueued so far is in Redis."""
        return self.client.flushed()

    # -- what sites and middlewares report -------------------------------------
    def mark_failed(self, request: Request, reason: str, kind: str = "download") -> None:
        """Dead-letter *request* when it leaves the engine (retries exhausted)."""
        self.failures.mark_failed(request, reason, kind)

    def slow_down(self, request: Request, retry_after: float | None) -> None:
        """*request*'s site answered a slow-down status: block its politeness key
        for *retry_after* seconds for every node, or back it off."""
        self.site_feedback.slow_down(request, retry_after)

    def _free_slots(self) -> int:
        downloader = getattr(self.crawler.engine, "downloader", None)
        if downloader is None:
            return self.prefetch
        total = downloader.total_concurrency or 1_000_000
        return max(0, total - len(downloader.active))

    def _on_response(self, response, request, spider):
        member = request.meta.get(LEASE_META)
        if member in self.client.held:
            self._scraping.add(member)

    # -- the loop's hooks --------------------------------------------------------
    def _accept(self, partition: int, member: str, payload: bytes) -> Request:
        try:
            request, proven = load_request(payload, self.spider, self.policy, self.signer)
        except RequestDecodeError as exc:
            logger.error("Invalid payload %s moved aside: %s", member, exc,
                         extra={"spider": self.spider})
            self.stats.inc_value(f"scheduler/invalid/{exc.code}")
            raise Rejected(str(exc)) from None
        if not proven:
            self._unproven += 1
        # Written by anyone (or an older version): canonical before it is fetched.
        request = self.urls.request(request)
        request.meta[LEASE_META] = member
        request.errback = LeaseErrback(self.failures.download_failed, member, request.errback)
        # What the frontier stored, before downloader middlewares added their
        # headers: a page record keeps it to fetch the page again (recrawl).
        request.meta[PAYLOAD_META] = payload
        if self.hooks:
            key = self.politeness.key(request)
            self._call_hooks("request_leased", request, member=member, partition=partition,
                             node=self.node, key=key)
        return request

    def _settled(self, request: Request, member: str, outcome: str) -> None:
        self._call_hooks("request_settled", request, member=member, outcome=outcome)

    def _call_hooks(self, name: str, *args, **kwargs) -> None:
        for hook in list(self.hooks):
            try:
                getattr(hook, name)(*args, **kwargs)
            except Exception:  # a hook's bug never stops the crawl: leave it out
                self.hooks.remove(hook)
                logger.exception("Request hook %r failed in %s: left out from now on", hook,
                                 name, extra={"spider": self.spider})

    def _node_report(self) -> dict:
        """What `crawlctl status` shows for this node (sent every few seconds)."""
        return self.report.status(self.client, downloading=self.downloading,
                                  lease_ttl=self.lease_ttl, state=self.control_state,
                                  waiting=self.start_state.held is not None)

    @property
    def control_state(self) -> str:
        """The operator's state for this spider (``run``, ``pause``, ``drain``, ``stop``)."""
        return self.control.state if self.control is not None else "run"

    @property
    def control_holds(self) -> bool:
        """Held by the stop or drain found at start: the node neither closes
        because of it nor counts as idle (CONTROL_ON_START = wait)."""
        return self.start_state.held is not None

    def _nudge_engine(self) -> None:
        # The engine polls next_request() only every few seconds when it got
        # None; tell it new requests are here.
        slot = getattr(self.crawler.engine, "_slot", None)
        if slot is not None:
            slot.nextcall.schedule()

    def _collect_done(self) -> None:
        """Acknowledge (or retry / dead-letter) requests that left the engine."""
        # The engine keeps every request it took from us in its slot until the
        # request is fully processed (download, callback output, item pipelines).
        self.flush_counts()
        slot = getattr(self.crawler.engine, "_slot", None)
        if slot is None:
            return  # no engine slot: nothing can be known done; leases are kept
        inprogress = slot.inprogress
        for member, entry in list(self.client.held.items()):
            request = entry.item
            if request in inprogress:
                continue
            self._scraping.discard(member)
            failure = self.failures.failed.pop(member, None)
            if failure is None:
                self.client.ack(member, relieve=not request.meta.get(SLOW_DOWN_META))
                self.report.count("scheduler/acked")
                outcome = ACK
            else:
                outcome = self.failures.handle(member, request, *failure)
            if self.hooks:
                self._settled(request, member, outcome)
        self.report.maybe_report(self.client)
        self.limits.maybe_refresh()

    @property
    def downloading(self) -> int:
        """Requests in this node's downloader (waiting for a slot or under way):
        the ``downloading`` of its report, the pause log line and the metrics."""
        downloader = getattr(self.crawler.engine, "downloader", None)
        return len(getattr(downloader, "active", ()))

    async def _close(self, reason: str) -> None:
        if self.client is None:
            return
        self.flush_counts()
        await self.limits.close()   # a refresh in flight: the next node's is enough
        await self.report.settle()
        await self.control.stop()
        await self.local.close()
        await self.failures.close()   # dead letters of kept requests, written before leaving
        leftovers = await self.client.close()
        self.flush_counts()   # the final calls' (the engine may have asked once more)
        await self.node_control.left_frontier()
        if self.hooks:  # back in the queue for another node
            for entry in leftovers:
                self._settled(entry.item, entry.member, RELEASED)
        await self.report.close(self.client)
        await self.client.partitions[0].client.aclose()
