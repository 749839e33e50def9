"""Data-only (JSON) encoding of Scrapy requests for storage in Redis.

Nothing read from Redis is ever unpickled. What a payload read back may do
is decided by :mod:`crawlproject.policy`: one a node of this crawl signed
(:mod:`crawlproject.signing`) comes back whole; anything else gets the seed
policy. A request that cannot be stored raises :class:`RequestEncodeError`
(the scheduler keeps it on the node that made it); decoding raises
:class:`RequestDecodeError` and nothing else, whatever the payload holds.
``dumps``/``loads`` are scrapy-redis' ``SCHEDULER_SERIALIZER`` interface, so
scrapy-redis' own scheduler can be kept pickle-free with
``SCHEDULER_SERIALIZER = "crawlproject.serialization"``.

The trust rule and the encoding in full: ``docs/frontier.md``, "Requests as
stored data (crawlproject/serialization.py)".
"""

from __future__ import annotations

import base64
import functools
import json
from typing import Any

from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest
from scrapy.utils.request import request_from_dict as _scrapy_request_from_dict

from crawlproject.identity.session import PROXY_ID
from crawlproject.identity.session import TRANSIENT as SESSION_TRANSIENT
from crawlproject.policy import InputPolicy, NodePolicy, Refused
from crawlproject.signing import Signer, unwrap

FORMAT_VERSION = 1

#: Request classes a stored payload may name in ``_class``.
ALLOWED_CLASSES: dict[str, type[Request]] = {
    "scrapy.http.request.Request": Request,
    "scrapy.http.request.form.FormRequest": FormRequest,
    "scrapy.http.request.json_request.JsonRequest": JsonRequest,
}

#: meta keys that only make sense inside one process; they are dropped.
TRANSIENT_META_KEYS = frozenset(
    {"playwright_page", "download_latency", "_crawlproject_lease", "_crawlproject_retry_delay",
     "_crawlproject_slow_down", "_auth_proxy", "_scheme_proxy", "_crawlproject_render_context",
     "_crawlproject_payload", "_crawlproject_recrawl_visit", "_crawlproject_parent",
     "_crawlproject_kept"}
) | SESSION_TRANSIENT
#: Headers never stored: Scrapy's HttpProxyMiddleware puts the proxy's
#: credentials in ``Proxy-Authorization`` (compared lower-case).
SECRET_HEADERS = frozenset({"proxy-authorization"})

#: meta key holding the values that per-download meta replaced (see
#: :func:`replace_meta`): they are put back before a request is stored.
ORIGINAL_META = "_crawlproject_original_meta"

_TAG = "__t__"
_NO_SPIDER = InputPolicy()
# Values a Request gets anyway when the key is absent.
_DEFAULTS = {"callback": None, "errback": None, "headers": {}, "body": "", "cookies": {},
             "meta": {}, "encoding": "utf-8", "flags": [], "cb_kwargs": {},
             "dont_filter": False, "method": "GET", "priority": 0}


def replace_meta(meta: dict, key: str, value: Any) -> None:
    """Set ``meta[key]`` for this download only, remembering what it held.

    For values a downloader middleware derives on every download and that must
    never be stored (a browser context holding proxy credentials): the request
    is stored with the original value (or without the key), whether it is
    stored after the download (:func:`restore_meta`) or before it."""
    saved = meta.setdefault(ORIGINAL_META, {})
    if key not in saved:
        saved[key] = [key in meta, meta.get(key)]
    meta[key] = value


def restore_meta(meta: dict) -> dict:
    """Undo every :func:`replace_meta` on *meta* (in place); return *meta*."""
    saved = meta.pop(ORIGINAL_META, None)
    for key, (present, value) in (saved or {}).items():
        if present:
            meta[key] = value
        else:
            meta.pop(key, None)
    return meta


class RequestEncodeError(ValueError):
    """A request holds data that cannot be stored as JSON."""


class RequestDecodeError(ValueError):
    """A stored payload is not a valid request; ``code`` is a short stats key."""

    def __init__(self, message: str, code: str = "malformed"):
        super().__init__(message)
        self.code = code


#: meta keys that mark ``proxy`` as chosen for one download by this node (the
#: proxy pool's ``proxy_id``, Scrapy's ``_scheme_proxy`` from the environment):
#: such a proxy is dropped, never stored nor honoured; the next download
#: chooses its own.
PER_DOWNLOAD_PROXY = (PROXY_ID, "_scheme_proxy")


def _stored_meta(meta: dict) -> dict:
    """*meta* without what only makes sense inside one process."""
    per_download = any(key in meta for key in PER_DOWNLOAD_PROXY)
    meta = {k: v for k, v in meta.items() if k not in TRANSIENT_META_KEYS}
    if per_download:
        meta.pop("proxy", None)
        meta.pop(PROXY_ID, None)
    return meta


def encode_value(value: Any, path: str) -> Any:
    """Return a JSON-safe form of *value*; *path* names it in errors."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [encode_value(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return _encode_dict(value, path)
    if isinstance(value, bytes):
        return {_TAG: "bytes", "b64": base64.b64encode(value).decode("ascii")}
    if _is_page_method(value):
        return _encode_page_method(value, path)
    raise RequestEncodeError(
        f"{path} holds a {type(value).__module__}.{type(value).__qualname__}, "
        "which cannot be stored in Redis as JSON; keep only JSON data "
        "(str, numbers, bool, None, lists, dicts), bytes or PageMethod there"
    )


def _encode_dict(value: dict, path: str) -> dict:
    out = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise RequestEncodeError(f"{path} has a non-string key {key!r}")
        out[key] = encode_value(item, f"{path}[{key!r}]")
    if _TAG in out:  # a user dict that looks like one of our tags
        return {_TAG: "dict", "items": out}
    return out


def _is_page_method(value: Any) -> bool:
    cls = type(value)
    return cls.__name__ == "PageMethod" and cls.__module__.startswith(
        "scrapy_playwright"
    )


def _encode_page_method(value: Any, path: str) -> dict:
    if not isinstance(value.method, str):
        raise RequestEncodeError(
            f"{path} is a PageMethod with a callable; only method names "
            "(e.g. 'wait_for_selector') can be stored"
        )
    return {
        _TAG: "PageMethod",
        "method": value.method,
        "args": encode_value(list(value.args), f"{path}.args"),
        "kwargs": encode_value(value.kwargs, f"{path}.kwargs"),
    }


def decode_value(value: Any, policy: InputPolicy | NodePolicy = _NO_SPIDER) -> Any:
    """Inverse of :func:`encode_value`; page methods must pass *policy*."""
    if isinstance(value, list):
        return [decode_value(v, policy) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {k: decode_value(v, policy) for k, v in value.items()}
    if tag == "bytes":
        return base64.b64decode(value["b64"], validate=True)
    if tag == "dict":
        return {k: decode_value(v, policy) for k, v in value["items"].items()}
    if tag == "PageMethod":
        try:
            return policy.page_method(value["method"], decode_value(value["args"], policy),
                                      decode_value(value["kwargs"], policy))
        except Refused as exc:
            raise RequestDecodeError(str(exc), exc.code) from None
    raise RequestDecodeError(f"unknown value tag {tag!r}")


def _encode_request_dict(d: dict[str, Any], policy: InputPolicy) -> dict[str, Any]:
    """*d* under the seed policy (no secret: what any node would accept from anyone)."""
    meta = _stored_meta(restore_meta(dict(d.get("meta") or {})))
    if isinstance(meta.get("proxy"), str):
        meta["proxy"] = _without_userinfo(meta["proxy"])
    headers = _stored_headers(d.get("headers"))
    try:
        # The checks of a payload read back: a node never stores what it would refuse.
        meta = policy.check_stored({**d, "meta": meta, "headers": headers,
                                    "callback": _name_or_none(d.get("callback")),
                                    "errback": _name_or_none(d.get("errback"))})["meta"]
    except Refused as exc:
        encode_value(meta, "meta")  # a value that cannot be stored at all says so first
        raise RequestEncodeError(str(exc)) from None
    out = dict(d)
    out["v"] = FORMAT_VERSION
    out["body"] = base64.b64encode(d.get("body") or b"").decode("ascii")
    out["headers"] = headers
    out["meta"] = encode_value(meta, "meta")
    out["cb_kwargs"] = encode_value(d.get("cb_kwargs") or {}, "cb_kwargs")
    _check_names(out)
    return _without_defaults(out)


def _encode_node_dict(d: dict[str, Any]) -> dict[str, Any]:
    """A node's own request, whole: only process-local meta, per-download
    proxies, proxy credentials and secret headers are left out."""
    meta = _stored_meta(restore_meta(dict(d.get("meta") or {})))
    if isinstance(meta.get("proxy"), str):
        meta["proxy"] = _without_userinfo(meta["proxy"])
    out = dict(d)
    out["v"] = FORMAT_VERSION
    out["body"] = base64.b64encode(d.get("body") or b"").decode("ascii")
    out["headers"] = _stored_headers(d.get("headers"))
    out["meta"] = encode_value(meta, "meta")
    out["cb_kwargs"] = encode_value(d.get("cb_kwargs") or {}, "cb_kwargs")
    out["cookies"] = encode_value(d.get("cookies") or {}, "cookies")
    _check_names(out)
    return _without_defaults(out)


def _stored_headers(headers) -> dict[str, list[str]]:
    return {
        _latin1(k): [_latin1(v) for v in (vs if isinstance(vs, list) else [vs])]
        for k, vs in (headers or {}).items()
        if _latin1(k).lower() not in SECRET_HEADERS
    }


def _check_names(out: dict) -> None:
    for key in ("callback", "errback"):
        if out.get(key) is not None and not isinstance(out[key], str):
            raise RequestEncodeError(f"{key} must be a spider method, got {out[key]!r}")


def _without_defaults(out: dict) -> dict:
    for key, default in _DEFAULTS.items():  # smaller payloads in Redis
        if key in out and out[key] == default:
            del out[key]
    return out


def _to_json(d: dict[str, Any]) -> str:
    try:
        return json.dumps(d, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise RequestEncodeError(f"request is not JSON-serialisable: {exc}") from exc


def decode_request_dict(d: Any, policy: InputPolicy = _NO_SPIDER) -> dict[str, Any]:
    """Validate and decode a stored payload that no node proved it wrote
    into ``request_from_dict`` input: the seed policy (*policy*)."""
    return _decode(d, policy, _unproven)


def decode_node_dict(d: Any, policy: NodePolicy) -> dict[str, Any]:
    """Decode a payload a node of this crawl proved it wrote: whole, but
    callbacks must be methods of the running spider and the class a request
    class; process-local meta is dropped."""
    return _decode(d, policy, _proven)


def _decode(d: Any, policy: InputPolicy | NodePolicy, finish) -> dict[str, Any]:
    """The fields of payload *d* decoded, its callbacks checked by *policy*,
    then ``finish(out, policy)``; raises :class:`RequestDecodeError` only."""
    if not isinstance(d, dict) or not isinstance(d.get("url"), str):
        raise RequestDecodeError("payload is not an object with a string 'url'")
    try:
        for key in ("callback", "errback"):
            if d.get(key) is not None:
                policy.check_callback(d[key], key)
        out = dict(d)
        out.pop("v", None)
        out["body"] = base64.b64decode(d.get("body") or "", validate=True)
        out["headers"] = {
            k.encode("latin-1"): [v.encode("latin-1") for v in vs]
            for k, vs in (d.get("headers") or {}).items()
        }
        out["meta"] = decode_value(d.get("meta") or {}, policy)
        out["cb_kwargs"] = decode_value(d.get("cb_kwargs") or {}, policy)
        if not isinstance(out["meta"], dict) or not isinstance(out["cb_kwargs"], dict):
            raise TypeError("meta and cb_kwargs must be objects")
        finish(out, policy)
    except RequestDecodeError:
        raise
    except Refused as exc:
        raise RequestDecodeError(str(exc), exc.code) from None
    except Exception as exc:  # noqa: BLE001 - whatever the payload holds
        raise RequestDecodeError(f"malformed payload: {type(exc).__name__}: {exc}") from None
    return out


def _unproven(out: dict, policy: InputPolicy) -> None:
    """The seed policy on what anyone else wrote (*out* decoded, in place)."""
    if "_class" in out and out["_class"] not in ALLOWED_CLASSES:
        raise Refused("class_not_allowed",
                      f"request class {str(out['_class'])[:100]!r} is not allowed")
    policy.check_url(out["url"])
    # Keys that only make sense inside one process are never stored: one read
    # from Redis was written by someone else (a lease, a parent, Scrapy's
    # proxy bookkeeping) and is dropped; every other key must pass the policy.
    policy.check_meta(out["meta"])  # a stored playwright_page too: refused, not dropped
    out["meta"] = policy.check_stored_meta(_stored_meta(out["meta"]))
    policy.check_request(out.get("method", "GET"), out["headers"], out["body"],
                         out.get("cookies"))


def _proven(out: dict, policy: NodePolicy) -> None:
    """What a node's own payload must still be (*out* decoded, in place)."""
    if "_class" in out and out["_class"] not in ALLOWED_CLASSES:
        policy.request_class(out["_class"])   # request_from_dict loads it again
    out["meta"] = _stored_meta(out["meta"])


def request_to_dict(request: Request, spider: Spider | None) -> dict[str, Any]:
    """Like ``Request.to_dict(spider=...)``, without scanning every spider member.

    Scrapy finds a callback's name with ``inspect.getmembers(spider)`` for each
    request; here the bound method's own name is checked with one ``getattr``.
    """
    d = {"url": request.url, "callback": _method_name(spider, request.callback, "callback"),
         "errback": _method_name(spider, request.errback, "errback"),
         "headers": dict(request.headers)}
    for attr in request.attributes:
        d.setdefault(attr, getattr(request, attr))
    if type(request) is not Request:  # noqa: E721 - subclasses need their class name
        d["_class"] = f"{type(request).__module__}.{type(request).__name__}"
    return d


def _method_name(spider: Spider | None, func: Any, what: str) -> Any:
    # A wrapper set for one download (the scheduler's LeaseErrback) names what to store.
    func = getattr(func, "stored_as", func)
    if func is None or isinstance(func, str) or not callable(func):
        return func
    name = getattr(func, "__name__", None)
    self_ = getattr(func, "__self__", None)
    if spider is not None and name and self_ is spider and getattr(spider, name, None) == func:
        return name
    raise RequestEncodeError(f"{what} {func!r} is not a method of the spider; "
                             "only spider methods can be stored (by name)")


def _policy(spider: Spider | None, policy: InputPolicy | None) -> InputPolicy:
    if policy is not None:
        return policy
    return _spider_policy(type(spider)) if spider is not None else _NO_SPIDER


@functools.lru_cache(maxsize=64)
def _spider_policy(spidercls: type) -> InputPolicy:
    return InputPolicy.from_settings(None, spidercls)


def _name_or_none(value: Any) -> Any:
    # A callable that is not a spider method is refused below, with its own message.
    return value if isinstance(value, str) else None


def request_to_json(request: Request, spider: Spider | None,
                    policy: InputPolicy | None = None, signer: Signer | None = None) -> str:
    """Encode *request*. With *signer* (a node of the crawl), whole and signed:
    callbacks must be methods of *spider*; without, under the seed policy
    (*policy*: callbacks *spider* published, allowed meta, method, headers).
    Raises :class:`RequestEncodeError` for what cannot be stored so."""
    d = request_to_dict(request, spider)
    if signer is not None:
        # One json.dumps: it is both the check and the payload.
        return signer.sign(_to_json(_encode_node_dict(d)))
    return _to_json(_encode_request_dict(d, _policy(spider, policy)))


def node_storable(request: Request, spider: Spider | None) -> bool:
    """Whether a node could store *request* signed (with ``FRONTIER_SECRET``)."""
    try:
        _to_json(_encode_node_dict(request_to_dict(request, spider)))
    except RequestEncodeError:
        return False
    return True


def request_from_json(data: bytes | str, spider: Spider | None,
                      policy: InputPolicy | None = None,
                      signer: Signer | None = None) -> Request:
    """Decode a payload written by :func:`request_to_json` (see :func:`load_request`)."""
    return load_request(data, spider, policy, signer)[0]


def load_request(data: bytes | str, spider: Spider | None, policy: InputPolicy | None = None,
                 signer: Signer | None = None) -> tuple[Request, bool]:
    """Decode a stored payload: ``(request, proven)``. A payload *signer*
    proves a node of this crawl wrote comes back whole; any other gets the
    seed policy (*policy*).

    Raises :class:`RequestDecodeError`, and only that, for anything that is
    not a request *spider* may run.
    """
    if signer is not None:
        text, proven = signer.open(data)
    else:
        text, proven = unwrap(data), False
    try:
        d = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise RequestDecodeError(f"payload is not JSON: {exc}") from None
    if proven:
        decoded = decode_node_dict(d, NodePolicy(spider))
    else:
        decoded = decode_request_dict(d, _policy(spider, policy))
    try:
        return _scrapy_request_from_dict(decoded, spider=spider), proven
    except Exception as exc:  # noqa: BLE001 - whatever the payload holds
        raise RequestDecodeError(f"not a valid request: {type(exc).__name__}: {exc}") from None


# scrapy-redis SCHEDULER_SERIALIZER interface (dict in, dict out).
def dumps(obj: dict[str, Any]) -> str:
    """Serialise a ``Request.to_dict()`` result (scrapy-redis interface)."""
    return _to_json(_encode_request_dict(obj, _NO_SPIDER))


def loads(data: bytes | str) -> dict[str, Any]:
    """Deserialise data from :func:`dumps` (scrapy-redis interface).

    scrapy-redis resolves callbacks itself, without telling us the spider:
    names are checked without it (no leading underscore, no framework hook).
    """
    try:
        d = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise RequestDecodeError(f"payload is not JSON: {exc}") from None
    return decode_request_dict(d)


def _without_userinfo(url: str) -> str:
    """*url* without ``user:password@`` (a proxy URL's credentials are never stored)."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if not sep or "@" not in authority:
        return url
    return f"{scheme}://{authority.rsplit('@', 1)[1]}{slash}{path}"


def _latin1(value: Any) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)

