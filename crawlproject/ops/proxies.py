"""The proxy pool as an operator sees it: entries ranked by trouble, bans,
retirements and nodes without a usable proxy (bounded output)."""

from __future__ import annotations


from crawlproject.keys import (
    ProxyKeys,
)


def proxy_report(client, spider: str, limit: int | None = 50) -> dict:
    """The proxy pool by masked id (health, bans per domain, retirements), the
    most troubled *limit* first (None: all; their order in ``ranked``), with
    counts; the pool entries that
    do not parse, the pool key's type, nodes without a usable proxy, and
    ``error`` when a proxy key has a wrong type (``proxies --json``)."""
    from crawlproject.proxies.pool import InvalidProxy, entry_fingerprint, parse_proxy
    from crawlproject.proxies.store import ProxyStateError, report_state

    bans_shown = 1000 if limit is None else max(limit * 4, 100)
    try:
        state = report_state(client, spider, bans_shown)
    except ProxyStateError as exc:
        return {"proxies": {}, "invalid_entries": [], "pool_key_type": "", "error": str(exc),
                "counts": {}, "no_usable_proxy": {}}
    now_ms = state["now_ms"]
    rows: dict[str, dict] = {}
    invalid = []
    for raw in state["entries"]:
        try:
            rows.setdefault(parse_proxy(raw).id, {})["in_redis_pool"] = True
        except InvalidProxy as exc:
            invalid.append({"entry": entry_fingerprint(raw), "error": exc.code, "reason": str(exc)})
    for pid, health in state["health"].items():
        row = rows.setdefault(pid, {})
        row.update({"ok": int(health.get("ok", 0)), "failures": int(health.get("fail", 0)),
                    "bans": int(health.get("ban", 0)), "latency_ms": health.get("lat"),
                    "failures_in_a_row": int(health.get("consec", 0))})
        if "seen" in health:
            row["last_seen_s_ago"] = round(max(0, now_ms - health["seen"]) / 1000, 1)
    for (pid, domain), (until, strikes) in state["bans"].items():
        if until > now_ms:
            rows.setdefault(pid, {}).setdefault("banned", {})[domain] = {
                "for_s": round((until - now_ms) / 1000, 1), "strikes": strikes}
    for pid, record in state["retired"].items():
        rows.setdefault(pid, {})["retired"] = str(record.get("reason", ""))
    ranked = sorted(rows, key=lambda pid: _proxy_rank(pid, rows[pid]))
    shown = ranked if limit is None else ranked[:limit]
    empty = {node: {"since_s_ago": round(max(0, now_ms - since) / 1000, 1)}
             for node, (since, at) in state["empty"].items() if now_ms - at < 30_000}
    error = ""
    if state["pool_type"] not in ("set", "hash", "none"):
        error = (f"Redis key {ProxyKeys(spider).pool} is a {state['pool_type']}, expected a set "
                 "or a hash of proxy URLs")
    return {"proxies": {pid: rows[pid] for pid in shown}, "ranked": shown,
            "invalid_entries": invalid if limit is None else invalid[:limit],
            "pool_key_type": state["pool_type"], "error": error, "no_usable_proxy": empty,
            "counts": {"proxies": len(rows), "shown": len(shown),
                       "retired": len(state["retired"]), "invalid_entries": len(invalid),
                       "ban_records": state["ban_records"],
                       "banned_now": sum(1 for r in rows.values() for _ in r.get("banned", ())),
                       "bad_values": len(state["bad"])}}


def _proxy_rank(pid: str, row: dict) -> tuple:
    """Most troubled first: banned for more hosts, more failures in a row,
    retired, more failures; then the busiest."""
    return (-len(row.get("banned", {})), -row.get("failures_in_a_row", 0),
            "retired" not in row, -row.get("failures", 0), -row.get("ok", 0), pid)
