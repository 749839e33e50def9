"""The politeness report: per-host state and run-time limits of a spider's
frontier partitions, read without loading every host (``crawlctl politeness``
prints it)."""

from __future__ import annotations

import heapq


def politeness_rows(parts: list, hosts: list[str], n: int) -> tuple[dict, int]:
    """The named *hosts*' rows (state and override), or else the *n* most
    queued hosts' and how many there are in all. Hosts are read in HSCAN
    windows and only the top *n* are kept: a crawl of millions of hosts is
    neither loaded into this process nor read from Redis in one command."""
    from crawlproject.frontier.sitelimits import partition_of

    limits = {}
    for part in parts:
        limits.update(part.limits())
    if hosts:
        by_part: dict[int, list[str]] = {}
        for key in hosts:
            by_part.setdefault(partition_of(key, len(parts)), []).append(key)
        rows = {}
        for p, keys in by_part.items():
            rows.update(parts[p].key_states(keys))
        rows = {key: {**state, "limits": limits.get(key)} for key, state in rows.items()}
        rows.update({key: {"limits": limits[key]} for key in hosts
                     if key in limits and key not in rows})
        return rows, len(rows)
    top: list[tuple[int, str]] = []       # a heap of (queued, key), least queued first
    kept: dict[str, dict] = {}
    for part in parts:
        for key, state in part.scan_key_states():
            if key in kept:               # HSCAN returned it again: the newer read
                kept[key] = state
                continue
            entry = (state["queued"], key)
            if len(top) < n:
                heapq.heappush(top, entry)
            elif n and entry > top[0]:
                kept.pop(heapq.heapreplace(top, entry)[1], None)
            else:
                continue
            kept[key] = state
    # Overrides of hosts without a state yet (set before any of their requests).
    extra: dict[int, list[str]] = {}
    for key in limits:
        if key not in kept:
            extra.setdefault(partition_of(key, len(parts)), []).append(key)
    missing = set()
    for p, keys in extra.items():
        states = parts[p].key_states(keys)
        missing.update(key for key in keys if key not in states)
    rows = {key: {**state, "limits": limits.get(key)}
            for key, state in sorted(kept.items(), key=lambda kv: (-kv[1]["queued"], kv[0]))}
    for key in sorted(missing)[:max(0, n - len(rows))]:
        rows[key] = {"limits": limits[key]}
    # (a count, not the scan's: HSCAN may return a field twice)
    return rows, sum(part.host_count() for part in parts) + len(missing)


def robots_states(client, spider: str, hosts: list[str], now: float) -> dict[str, dict]:
    """What the cluster knows of each host's robots.txt: ``{"status", "state",
    "expires_in_s"}`` from the last record stored for it (records that are not
    ours are left out: the index is read from Redis, so untrusted)."""
    import json

    from crawlproject.keys import RobotsKeys
    from crawlproject.robots.record import RobotsRecord

    if not hosts:
        return {}
    out = {}
    for host, raw in zip(hosts, client.hmget(RobotsKeys(spider).index, hosts)):
        if raw is None:
            continue
        try:
            data = json.loads(raw)
            status, expires = int(data["status"]), float(data["expires"])
        except (ValueError, TypeError, KeyError):
            continue
        out[host] = {"status": status,
                     "state": RobotsRecord(status, "", 0.0, expires).state,
                     "expires_in_s": round(expires - now, 1)}
    return out


def budget_rows(parts: list, hosts: list[str]) -> dict[str, dict]:
    """New pages admitted and refused over a budget per host, and ``"||crawl"``
    for the whole crawl (the partitions' sums); counted while budgets apply."""
    from crawlproject.frontier.sitelimits import partition_of

    by_part: dict[int, list[str]] = {}
    for key in hosts:
        by_part.setdefault(partition_of(key, len(parts)), []).append(key)
    out: dict[str, dict] = {}
    crawl = {"admitted": 0, "refused": 0}
    for p, part in enumerate(parts):
        counts = part.budget_counts(by_part.get(p, []))
        total = counts.pop("||crawl", None)
        if total:
            crawl = {k: crawl[k] + total[k] for k in crawl}
        out.update(counts)
    if crawl["admitted"] or crawl["refused"]:
        out["||crawl"] = crawl
    return out
