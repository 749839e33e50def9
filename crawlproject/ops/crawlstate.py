"""What an operator asks first: is the crawl running, finished, stopped, idle
or stuck? Told from the operator's state, the nodes' reports and the
frontier's counts (one :func:`crawl_state` over ``status_data``'s dict).

The operator's state (``run``, ``pause``, ``drain``, ``stop``) says what the
nodes are told; it stays ``run`` after the last node closed, so it alone
cannot say whether anything runs. A node reports every few seconds and
removes its report when it closes: no report and nothing left in the
frontier is a finished crawl, no report with work left a stopped one.
"""

from __future__ import annotations

#: a report older than this (reports come every 5 s) is a node that stopped
#: answering: it may hang, or have been killed (its leases are reclaimed)
REPORT_LATE_S = 30.0

STATES = ("running", "finished", "stopped", "paused", "draining", "idle", "stuck")


def work_left(data: dict) -> int:
    """Requests queued (in Redis or MongoDB), delayed or in flight, and seeds
    waiting or claimed."""
    f, s = data["frontier"], data["seeds"]
    backlog = (data.get("backlog") or {}).get("queued_mongodb", 0)
    return f["queued"] + backlog + f["delayed"] + f["inflight"] + s["waiting"] + s["claimed"]


def pages_crawled(data: dict) -> int:
    """Pages done cluster-wide (acknowledged by the nodes: answered and parsed)."""
    return int(data.get("totals", {}).get("scheduler/acked", 0))


def crawl_state(data: dict) -> dict:
    """``{"state": one of STATES, "why": a sentence}`` for ``status_data``'s *data*."""
    control = data["control"].get("state", "run")
    nodes = data["nodes"]
    live = [r for r in nodes if r.get("age_s", 0) <= REPORT_LATE_S]
    late = [r for r in nodes if r.get("age_s", 0) > REPORT_LATE_S]
    left, f = work_left(data), data["frontier"]
    crawled = pages_crawled(data)
    if control == "stop":
        return _state("stopped", "the operator stopped the crawl: nodes close, nodes started "
                                 f"later wait; {left:,} requests and seeds left")
    if control == "pause":
        return _state("paused", f"the operator paused the crawl ({len(live)} node(s) wait)")
    if not live and not late:
        if left:
            return _state("stopped", f"no node is running; {left:,} requests and seeds wait "
                                     "(start nodes to go on)")
        if crawled or f["dead"] or data.get("bloom", {}).get("items"):
            return _state("finished", f"no node is running and nothing is left to do: "
                                      f"{crawled:,} pages crawled")
        return _state("idle", "no node is running and no crawl has started (push seeds, "
                              "start nodes)")
    if late and not live:
        oldest = max(r["age_s"] for r in late)
        return _state("stuck", f"{len(late)} node(s) stopped reporting ({oldest:g} s ago): "
                               "hung or killed; their leases are reclaimed when they expire")
    if control == "drain":
        return _state("draining", f"no seeds taken; {len(live)} node(s) finish the "
                                  f"{left:,} requests left, then close")
    if not left:
        return _state("idle", f"{len(live)} node(s) wait for work: nothing queued, delayed or "
                              "in flight (they close after MAX_IDLE_TIME_BEFORE_CLOSE if set)")
    moving = (data["rates"]["pages_per_s"] > 0 or f["inflight"] > 0
              or any(r.get("downloading") for r in live))
    pol = data.get("politeness", {})
    # (a host's interval, a Retry-After, a backoff: waiting is not being stuck)
    held_back = (pol.get("blocked", 0) or pol.get("backing_off", 0)
                 or any((h.get("next_start_in_s") or 0) > 0 for h in pol.get("top", [])))
    if moving or held_back or not f["queued"]:
        return _state("running", f"{len(live)} node(s) crawling; {left:,} requests and "
                                 "seeds left")
    return _state("stuck", f"{f['queued']:,} requests queued, none in flight and no page in "
                           f"the last minute on {len(live)} node(s)")


def _state(state: str, why: str) -> dict:
    return {"state": state, "why": why}
