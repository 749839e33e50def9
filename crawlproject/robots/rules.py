"""What a robots.txt means for this crawler, without its padding.

A robots.txt can be 500 KiB of comments, groups for other crawlers and
unknown lines around three rules that apply here. :func:`normalise` keeps only
what the crawler obeys (RFC 9309 §2.2): the groups whose ``user-agent`` line
names this crawler's product token, and the ``*`` group, with their
``allow``/``disallow``/``crawl-delay`` lines, and the ``sitemap`` lines,
written again one normalised line each (``field: value``). A parser (Protego,
``ROBOTSTXT_PARSER``) reads the result as it would have read the whole file
for this user agent; the cluster stores and each node parses only that, so
what a record costs follows its rules, and at most ``max_rules`` of them: the
rules after that are dropped (counted), as RFC 9309 §2.5 lets a crawler stop
parsing. Fewer rules also bound what checking one URL costs.

:func:`decode_body` undoes ``Content-Encoding`` (gzip, deflate, br, zstd) and
stops at a number of decompressed bytes: a decompression bomb costs that much,
never more.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

#: The fields kept, by the names Protego also reads (its common misspellings
#: too: what the site meant is what a parser of the whole file would obey).
_FIELDS = {
    "user-agent": "user-agent", "useragent": "user-agent", "user agent": "user-agent",
    "allow": "allow",
    "disallow": "disallow", "dissallow": "disallow", "dissalow": "disallow",
    "disalow": "disallow", "diasllow": "disallow", "disallaw": "disallow",
    "crawl-delay": "crawl-delay", "crawl delay": "crawl-delay",
    "sitemap": "sitemap", "sitemaps": "sitemap", "site-map": "sitemap",
    # not kept, but read: a group's other lines end its user-agent lines; host
    # is site-wide (Protego: it does not end them either)
    "request-rate": "other", "request rate": "other", "visit-time": "other",
    "visit time": "other", "host": "host",
}
_GROUP_RULES = ("allow", "disallow", "crawl-delay")
_SITE_WIDE = ("sitemap", "host")
#: Distinct user-agent values of one group, and kept in all (only values that
#: apply to this crawler are kept: its token and ``*``, a few at most).
MAX_AGENTS = 20
#: Longest value kept (a URL pattern longer than a URL can be matches nothing).
MAX_VALUE = 4096
#: Sitemap lines kept (they are not rules: bounded on their own).
MAX_SITEMAPS = 100


@dataclass(frozen=True)
class Normalised:
    """The kept lines (UTF-8) and how many rules were dropped over the bound."""

    text: bytes
    rules: int
    dropped: int


def product_token(agent: str) -> str:
    """The product token of a User-Agent string (``"MyBot/1.0 (+url)"`` → ``"mybot"``)."""
    token = agent.strip().split("/", 1)[0].split(None, 1)
    return token[0].lower() if token else ""


def applies(group_agent: str, agent: str) -> bool:
    """Whether a group's ``user-agent`` value applies to *agent* (the crawler's
    whole User-Agent string), as Protego decides it: ``*``, or the value found
    in it at a token boundary, case-insensitively (``*`` in a value ignored)."""
    value = group_agent.strip().lower()
    if value == "*":
        return True
    value = value.replace("*", "")
    agent = agent.strip().lower()
    if not value:
        return False
    index = agent.find(value)
    while index != -1:
        if index == 0 or not (agent[index - 1].isalnum() or agent[index - 1] in "-_"):
            return True
        index = agent.find(value, index + 1)
    return False


def _directive(line: str) -> tuple[str, str] | None:
    hash_pos = line.find("#")
    if hash_pos != -1:
        line = line[:hash_pos]
    line = line.strip()
    if not line:
        return None
    if ":" in line:
        field, value = line.split(":", 1)
        field = field.strip().lower()
        if field in _FIELDS:
            return _FIELDS[field], value.strip()
    words = line.split(None, 2)   # "User-agent foo", "Sitemap https://..."
    for count in (2, 1):
        if len(words) > count and " ".join(words[:count]).lower() in _FIELDS:
            return _FIELDS[" ".join(words[:count]).lower()], " ".join(words[count:]).strip()
    return ("?", "") if ":" in line else None


def normalise(body: bytes, agent: str, max_rules: int) -> Normalised:
    """The lines of robots.txt *body* that apply to *agent* (see the module
    docstring), at most *max_rules* allow/disallow rules.

    Rules are written per user-agent value, as Protego merges every group
    naming one value into one rule set (and its last ``crawl-delay`` wins).
    """
    text = body.decode("utf-8", "replace")
    kept: dict[str, list[str]] = {}     # user-agent value -> its rules
    delays: dict[str, str] = {}
    sitemaps: list[str] = []
    agents: list[str] = []              # the values of the group being read
    current: list[str] = []             # those that apply to *agent*
    in_agents = False
    rules = dropped = 0
    for line in text.lstrip("\ufeff").splitlines():
        parsed = _directive(line)
        if parsed is None:
            continue
        field, value = parsed
        if field == "user-agent":
            if not in_agents:
                agents, in_agents = [], True
            value = value.lower()
            if value and applies(value, agent) and len(agents) < MAX_AGENTS:
                agents.append(value)
            continue
        if field in _SITE_WIDE:
            if (field == "sitemap" and value and len(value) <= MAX_VALUE
                    and len(sitemaps) < MAX_SITEMAPS):
                sitemaps.append(value)
            continue
        if in_agents:    # the group's first rule: which of its agents apply here
            in_agents = False
            current = agents
            for a in current:
                if a not in kept and len(kept) < MAX_AGENTS:
                    kept[a] = []
            current = [a for a in current if a in kept]
        if not current or field not in _GROUP_RULES or not value or len(value) > MAX_VALUE:
            continue
        if field == "crawl-delay":
            for a in current:
                delays[a] = value
            continue
        if rules + len(current) > max_rules:
            dropped += 1
            continue
        rules += len(current)
        for a in current:
            kept[a].append(f"{field}: {value}")
    for a in agents if in_agents else ():   # user-agent lines at the very end
        if len(kept) < MAX_AGENTS:
            kept.setdefault(a, [])
    lines = []
    for a, group in kept.items():
        lines.append(f"user-agent: {a}")
        if a in delays:
            lines.append(f"crawl-delay: {delays[a]}")
        # A group without rules allows everything for its agents; an empty
        # "disallow:" says so, and ends the group (two user-agent lines in a
        # row would share the next group's rules).
        lines += group if group or a in delays else ["disallow:"]
    lines += [f"sitemap: {s}" for s in sitemaps]
    return Normalised(("\n".join(lines) + "\n" if lines else "").encode("utf-8"), rules,
                      dropped)


# -- Content-Encoding ---------------------------------------------------------

class UnknownEncoding(ValueError):
    """A Content-Encoding this crawler cannot undo."""


def decode_body(body: bytes, encodings: list[str], limit: int) -> bytes:
    """*body* with *encodings* (as in ``Content-Encoding``, applied in that
    order) undone, at most *limit* bytes of it (the rest is never produced).
    A truncated stream gives what it holds; ``ValueError`` when it cannot be
    read at all."""
    for encoding in reversed([e.strip().lower() for e in encodings if e.strip()]):
        if encoding in ("identity", ""):
            continue
        if encoding in ("gzip", "x-gzip"):
            body = _inflate(body, zlib.MAX_WBITS | 16, limit)
        elif encoding == "deflate":
            try:
                body = _inflate(body, zlib.MAX_WBITS, limit)
            except zlib.error:   # raw deflate, as some servers send it
                body = _inflate(body, -zlib.MAX_WBITS, limit)
        elif encoding == "br":
            body = _unbrotli(body, limit)
        elif encoding == "zstd":
            body = _unzstd(body, limit)
        else:
            raise UnknownEncoding(f"unknown Content-Encoding {encoding[:40]!r}")
    return body[:limit]


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    inflate = zlib.decompressobj(wbits)
    try:
        return inflate.decompress(data, limit)
    except zlib.error as exc:
        if wbits == zlib.MAX_WBITS:
            raise
        raise ValueError(f"not a {'gzip' if wbits > 16 else 'deflate'} stream: {exc}") from None


def _unbrotli(data: bytes, limit: int) -> bytes:
    try:
        import brotli
    except ImportError:   # pragma: no cover - Scrapy installs one of them
        import brotlicffi as brotli
    try:
        out = brotli.Decompressor().process(data, output_buffer_limit=limit)
    except (brotli.error, TypeError) as exc:
        raise ValueError(f"not a brotli stream: {exc}") from None
    return out[:limit]


def _unzstd(data: bytes, limit: int) -> bytes:
    try:
        from compression import zstd
    except ImportError:
        from backports import zstd
    try:
        return zstd.ZstdDecompressor().decompress(data, max_length=limit)
    except zstd.ZstdError as exc:
        raise ValueError(f"not a zstd stream: {exc}") from None
