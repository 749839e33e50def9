"""The project's Lua scripts as one Redis Functions library, and how nodes call it.

A node runs registered code only. On Redis 7 every script of the project
(:mod:`crawlproject.frontier.scripts`, the proxy pool's ``REFRESH``) is a
function of one library, loaded with ``FUNCTION LOAD`` and called with
``FCALL``; a node's ACL user may call functions, never load code
(``deploy/users.acl``: no ``EVAL``, ``EVALSHA``, ``SCRIPT``, ``FUNCTION``).

The library is built at import from the same texts ``EVAL`` would run (the
``.lua`` files stay the source): each script's text, unchanged, is the body of
``local function NAME(KEYS, ARGV) ... end``, so its ``KEYS``/``ARGV`` are the
function's arguments and its locals stay locals. Names carry a hash of the
code (library ``crawlproject_<hash>``, functions ``crawlproject_<hash>_<script>``):
nodes of different versions never call each other's code, and loading is
idempotent (a library that exists under its name is that code).

Who loads it: the first caller that finds it missing and may
(``FUNCTION LOAD``: the default user of a plain ``redis-server``, the
operator's ``crawlctl functions load``), on every master of a cluster. A
caller that may not gets :class:`LibraryMissingError`, which names the command
to run; the node logs it and retries (a refused call: its work is kept).

Redis 6.2 has no functions: the same objects call ``EVALSHA`` of the script
text (``SCRIPT LOAD`` first by whoever may: the operator under the ACL). Its
script cache is lost when Redis restarts (docs/deploy.md, "Redis functions").
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import weakref
from functools import lru_cache
from importlib.resources import files

from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

logger = logging.getLogger(__name__)

PREFIX = "crawlproject_"
LOAD_COMMAND = "crawlctl functions load"
_UNKNOWN_COMMAND = "unknown command"
_NOT_FOUND = "function not found"
_EXISTS = "already exists"
#: The commands that run a script, as ``INFO commandstats`` names them (without ``cmdstat_``).
SCRIPT_COMMANDS = ("fcall", "fcall_ro", "evalsha", "eval")


def script_calls(commandstats: dict) -> int:
    """Script calls that ran, in redis-py's ``info("commandstats")``."""
    return sum(s.get("calls", 0) - s.get("failed_calls", 0) for name, s in commandstats.items()
               if name.removeprefix("cmdstat_") in SCRIPT_COMMANDS)


class LibraryMissingError(ResponseError):
    """The library (or on Redis 6.2 a script) is not in Redis and this user may not load it."""


@lru_cache(maxsize=None)
def scripts() -> dict[str, str]:
    """Script name -> its text, every script a node or ``crawlctl`` runs."""
    from crawlproject.frontier import scripts as s

    refresh = files("crawlproject.proxies").joinpath("lua", "refresh.lua").read_text(
        encoding="utf-8")   # (as crawlproject.proxies.store reads it)
    return {"sync": s.SYNC, "bloom_add": s.BLOOM_ADD, "replay_dead": s.REPLAY_DEAD,
            "set_limits": s.SET_LIMITS, "claim_seeds": s.CLAIM_SEEDS,
            "renew_claims": s.RENEW_CLAIMS, "clear_drain": s.CLEAR_DRAIN,
            "robots_fetch_lock": s.ROBOTS_FETCH_LOCK, "proxy_refresh": refresh,
            "feed_sitemap_seeds": s.FEED_SITEMAP_SEEDS, "claim_moves": s.CLAIM_MOVES,
            "spill_commit": s.SPILL_COMMIT, "refill_commit": s.REFILL_COMMIT,
            "refill_done": s.REFILL_DONE}


@lru_cache(maxsize=None)
def library() -> tuple[str, str]:
    """``(library name, FUNCTION LOAD code)`` of this version."""
    bodies = "".join(f"local function {name}(KEYS, ARGV)\n{text}\nend\n"
                     for name, text in scripts().items())
    name = PREFIX + hashlib.sha1(bodies.encode()).hexdigest()[:16]
    registrations = "".join(f"redis.register_function('{name}_{script}', {script})\n"
                            for script in scripts())
    header = (f"#!lua name={name}\n-- crawlproject's scripts (crawlproject/frontier/library.py):"
              " each one's text is the body of a function of (KEYS, ARGV).\n")
    return name, header + bodies + registrations


def function_name(script: str) -> str:
    return f"{library()[0]}_{script}"


def script(client, text: str):
    """The script *text* (one of :func:`scripts`) on *client*, called like
    redis-py's ``register_script``: ``f(keys=[...], args=[...])``, awaited
    with an asyncio client."""
    for name, known in scripts().items():
        if known == text:
            cls = AsyncFunction if _is_async(client) else Function
            return cls(client, name, text)
    raise KeyError("not a script of the library: add it to crawlproject.frontier.library.scripts")


def _is_async(client) -> bool:
    return inspect.iscoroutinefunction(getattr(client, "execute_command", None))


def _is_cluster(client) -> bool:
    return hasattr(client, "get_primaries")


# Whether the server has functions (True), has none (False: Redis 6.2), or not yet known.
_HAS_FUNCTIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _user(client) -> str:
    pool = (getattr(client, "connection_pool", None)          # one server
            or getattr(client, "nodes_manager", None))         # a cluster
    kwargs = getattr(pool, "connection_kwargs", None) or getattr(client, "connection_kwargs",
                                                                  None) or {}
    return kwargs.get("username") or "default"


_told: set[str] = set()


def _missing(client, what: str, command: str) -> LibraryMissingError:
    # (the refusal's own words are left out: they would read as a missing right
    # of the node, crawlproject.acl.refusal, when the fix is the operator's load)
    message = (f"Redis has no {what} of this crawlproject version, and Redis user "
               f"{_user(client)!r} may not load it ({command} refused): run `{LOAD_COMMAND}` "
               "with the operator's credentials (docs/deploy.md, \"Redis functions\"); "
               "the node retries")
    if what not in _told:  # one ERROR per process: the outage log repeats the rest
        _told.add(what)
        logger.error("%s", message)
    return LibraryMissingError(message)


def _classify(exc: ResponseError) -> str:
    text = str(exc).lower()
    if isinstance(exc, NoPermissionError):
        return "refused"
    if _UNKNOWN_COMMAND in text and "fcall" in text:
        return "no functions"
    if _NOT_FOUND in text:
        return "missing"
    return "other"


class _Base:
    def __init__(self, client, name: str, text: str):
        self.client, self.name, self.text = client, name, text
        self.function = function_name(name)
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    @property
    def _functions(self):
        try:
            return _HAS_FUNCTIONS.get(self.client)
        except TypeError:  # not weak-referenceable
            return getattr(self, "_has", None)

    @_functions.setter
    def _functions(self, value: bool) -> None:
        try:
            _HAS_FUNCTIONS[self.client] = value
        except TypeError:
            self._has = value

    def _fcall_args(self, keys, args) -> tuple:
        return ("FCALL", self.function, len(keys), *keys, *args)

    def _route(self, keys) -> dict:
        """A cluster's node for FCALL, from the slot cache: redis-py would ask
        the server (``COMMAND GETKEYS``) before every FCALL, as it does not for
        EVALSHA."""
        if not _is_cluster(self.client):
            return {}
        node = (self.client.get_node_from_key(keys[0]) if keys
                else self.client.get_random_node())
        return {"target_nodes": node}

    def _evalsha_args(self, keys, args) -> tuple:
        return ("EVALSHA", self.sha, len(keys), *keys, *args)


def _targets(client) -> list:
    """Where code is loaded: every master of a cluster, else the one server."""
    return list(client.get_primaries()) if _is_cluster(client) else [None]


def _load_args(target) -> dict:
    return {} if target is None else {"target_nodes": target}


class Function(_Base):
    """A script of the library on a synchronous client."""

    def __call__(self, keys=(), args=(), client=None):
        keys, args = list(keys), list(args)
        if self._functions is not False:
            try:
                result = self.client.execute_command(*self._fcall_args(keys, args),
                                                     **self._route(keys))
                self._functions = True
                return result
            except ResponseError as exc:
                kind = _classify(exc)
                if kind == "missing":
                    load(self.client)
                    return self.client.execute_command(*self._fcall_args(keys, args),
                                                       **self._route(keys))
                if kind != "no functions":
                    raise
                self._functions = False
        try:
            return self.client.execute_command(*self._evalsha_args(keys, args))
        except NoScriptError:
            load(self.client, functions=False)
            return self.client.execute_command(*self._evalsha_args(keys, args))


class AsyncFunction(_Base):
    """A script of the library on an asyncio client."""

    async def __call__(self, keys=(), args=(), client=None):
        keys, args = list(keys), list(args)
        if self._functions is not False:
            try:
                if getattr(self.client, "_initialize", False):   # no slot cache yet
                    await self.client.initialize()
                result = await self.client.execute_command(*self._fcall_args(keys, args),
                                                           **self._route(keys))
                self._functions = True
                return result
            except ResponseError as exc:
                kind = _classify(exc)
                if kind == "missing":
                    await load_async(self.client)
                    return await self.client.execute_command(*self._fcall_args(keys, args),
                                                             **self._route(keys))
                if kind != "no functions":
                    raise
                self._functions = False
        try:
            return await self.client.execute_command(*self._evalsha_args(keys, args))
        except NoScriptError:
            await load_async(self.client, functions=False)
            return await self.client.execute_command(*self._evalsha_args(keys, args))


def load(client, functions: bool = True) -> dict:
    """Load this version's code where *client* points (every master of a
    cluster): the library on Redis 7, the scripts (``SCRIPT LOAD``) on 6.2
    (or with *functions* False). Returns ``{"library", "functions": bool,
    "loaded": masters where it was new, "masters"}``. Raises
    :class:`LibraryMissingError` when the user may not."""
    name, code = library()
    loaded, targets = 0, _targets(client)
    for target in targets:
        kwargs = _load_args(target)
        if functions:
            try:
                client.execute_command("FUNCTION", "LOAD", code, **kwargs)
                loaded += 1
                continue
            except ResponseError as exc:
                functions = _has_functions(client, exc, name)
            if functions:  # the library was there
                continue
        for text in scripts().values():
            try:
                client.execute_command("SCRIPT", "LOAD", text, **kwargs)
            except NoPermissionError as exc:
                raise _missing(client, "scripts", "SCRIPT LOAD") from exc
        loaded += 1
    return {"library": name, "functions": functions, "loaded": loaded, "masters": len(targets)}


async def load_async(client, functions: bool = True) -> dict:
    """:func:`load` with an asyncio client."""
    name, code = library()
    loaded, targets = 0, _targets(client)
    for target in targets:
        kwargs = _load_args(target)
        if functions:
            try:
                await client.execute_command("FUNCTION", "LOAD", code, **kwargs)
                loaded += 1
                continue
            except ResponseError as exc:
                functions = _has_functions(client, exc, name)
            if functions:
                continue
        for text in scripts().values():
            try:
                await client.execute_command("SCRIPT", "LOAD", text, **kwargs)
            except NoPermissionError as exc:
                raise _missing(client, "scripts", "SCRIPT LOAD") from exc
        loaded += 1
    return {"library": name, "functions": functions, "loaded": loaded, "masters": len(targets)}


def _has_functions(client, exc: ResponseError, name: str) -> bool:
    """A refused ``FUNCTION LOAD``: whether the server has functions, when the
    refusal is harmless (the library exists; no functions: Redis 6.2), else raised."""
    text = str(exc).lower()
    if _EXISTS in text:
        return True
    if _UNKNOWN_COMMAND in text:
        return False
    if isinstance(exc, NoPermissionError):
        raise _missing(client, f"functions library {name}", "FUNCTION LOAD") from exc
    raise exc
