"""Scalable, sharded Bloom filter in Redis: sizing, estimates, standalone use.

The bits live in ``{spider}:bloom:<layer>:<shard>`` strings and the layer table
in the ``{spider}:bloom`` hash (see :mod:`crawlproject.keys`). All reads and
writes happen inside Lua (:mod:`crawlproject.frontier.scripts`): checking and
adding a whole batch of fingerprints is one call, and the scheduler's call
also enqueues the new requests in the same atomic step.

Sizing follows Almeida et al., "Scalable Bloom Filters" (2007): layer 0 holds
``capacity`` fingerprints at error rate ``p0 = error_rate * (1 - r)``; when a
layer is full a new one is added with ``growth`` times the capacity and
error rate ``p_i = p0 * r^i`` (``r`` = tightening), so the compound rate stays
below ``p0 / (1 - r) = error_rate`` however far the crawl outgrows its plan.
The defaults (r = 0.1, growth 4) spend most of the error budget on layer 0,
which holds the planned crawl: 14.6 bits (1.83 bytes) per URL at 1e-3, close
to a plain Bloom filter's 14.4, and overflow layers are rare and large.

A layer is split into shards of at most ``shard_bits`` bits (one fingerprint's
bits all fall in one shard), so no Redis string nears its 512 MB limit. Each
shard is sized to fill the allocator's size class that Redis will reserve for
it anyway: the spare bits lower the false-positive rate at no memory cost.

Shard keys are derived from the meta key, ``<meta key>:<layer>:<shard>``
(:func:`crawlproject.keys.bloom_shard_key`): scripts get only the meta key in
KEYS, and the shards share its hash tag, hence its Redis Cluster slot.

Growth never blocks Redis for long: a shard is created at its final size in
one allocation (``SETRANGE`` on a missing key), and while the newest layer
nears capacity (from 90 % full) each adding call makes at most one shard of
the next layer (counted in the meta field ``ahead``), so opening a 100 MB
layer is not one 100 MB call. The exceptions are listed in
:mod:`crawlproject.frontier.scripts`. Shards made ahead are real keys: they
count in memory figures and :meth:`BloomFilter.clear` deletes them.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Iterable

from crawlproject import defaults
from crawlproject.defaults import setting
from crawlproject.frontier.library import script
from crawlproject.frontier.scripts import BLOOM_ADD
from crawlproject.keys import bloom_shard_key
from crawlproject.keys import as_text as _s

MAX_SHARD_BITS = 2**32 - 1  # a Redis string holds at most 512 MB


@dataclass(frozen=True)
class BloomConfig:
    """Planned capacity and error rate, and how the filter grows and shards."""

    capacity: int = defaults.DUPEFILTER_CAPACITY
    error_rate: float = defaults.DUPEFILTER_ERROR_RATE
    growth: float = defaults.DUPEFILTER_GROWTH
    tightening: float = defaults.DUPEFILTER_TIGHTENING
    # at most 8 MiB per key: a shard is made in ~8 ms, and smaller shards make
    # every call faster (median 1000-URL call 18 ms vs 33 ms with 32 MiB shards)
    shard_bits: int = defaults.DUPEFILTER_SHARD_BITS

    def __post_init__(self):
        if self.capacity < 1:
            raise ValueError("Bloom capacity must be at least 1")
        if not 0 < self.error_rate < 1:
            raise ValueError("Bloom error rate must be between 0 and 1")
        if self.growth < 1 or not 0 < self.tightening < 1:
            raise ValueError("Bloom growth must be >= 1 and tightening in (0, 1)")
        if not 1024 <= self.shard_bits <= MAX_SHARD_BITS:
            raise ValueError(f"Bloom shard bits must be in [1024, {MAX_SHARD_BITS}]")

    @classmethod
    def from_settings(cls, settings) -> "BloomConfig":
        return cls(
            capacity=setting(settings, "DUPEFILTER_CAPACITY"),
            error_rate=setting(settings, "DUPEFILTER_ERROR_RATE"),
            growth=setting(settings, "DUPEFILTER_GROWTH"),
            tightening=setting(settings, "DUPEFILTER_TIGHTENING"),
            shard_bits=setting(settings, "DUPEFILTER_SHARD_BITS"),
        )

    def args(self) -> list:
        """The ARGV the Lua scripts expect for the filter's parameters."""
        return [self.capacity, repr(self.error_rate), repr(self.growth),
                repr(self.tightening), self.shard_bits]


def fingerprint_hex(fp: bytes | str) -> str:
    """The 40-hex form the scripts hash (SHA1 of other fingerprint sizes)."""
    if isinstance(fp, str):
        fp = fp.encode()
    if len(fp) == 20:
        return fp.hex()
    return hashlib.sha1(fp).hexdigest()


def shard_keys(meta_key: str, meta: dict) -> list[str]:
    """Every shard key of the filter at *meta_key*: those of its layers and
    those of the next layer already made ahead of time."""
    meta = {_s(k): _s(v) for k, v in meta.items()}
    layers = int(meta.get("layers", 0))
    keys = [bloom_shard_key(meta_key, i, s)
            for i in range(layers) for s in range(int(meta[f"shards{i}"]))]
    keys += [bloom_shard_key(meta_key, layers, s) for s in range(int(meta.get("ahead", 0)))]
    return keys


def layer_estimates(meta: dict) -> list[dict]:
    """Per-layer fill ratio and false-positive estimates from the layer table."""
    meta = {_s(k): _s(v) for k, v in meta.items()}
    layers = []
    for i in range(int(meta.get("layers", 0))):
        n, cap = int(meta[f"n{i}"]), float(meta[f"cap{i}"])
        k = int(meta[f"k{i}"])
        bits = int(meta[f"bits{i}"]) * int(meta[f"shards{i}"])
        fill = 1 - math.exp(-k * n / bits) if bits else 0.0
        layers.append({"layer": i, "count": n, "capacity": cap, "k": k, "bits": bits,
                       "shards": int(meta[f"shards{i}"]), "fill_ratio": fill,
                       "fp_rate": fill**k})
    return layers


def filter_estimates(meta: dict) -> dict:
    """Totals over all layers: items, bits, fill ratio, estimated FP rate."""
    layers = layer_estimates(meta)
    miss = 1.0
    for layer in layers:
        miss *= 1 - layer["fp_rate"]
    bits = sum(layer["bits"] for layer in layers)
    count = sum(layer["count"] for layer in layers)
    fill = sum(layer["fill_ratio"] * layer["bits"] for layer in layers) / bits if bits else 0.0
    return {"layers": len(layers), "count": count, "bits": bits, "fill_ratio": fill,
            "est_fp_rate": 1 - miss, "bytes_per_item": bits / 8 / count if count else 0.0,
            "capacity": sum(layer["capacity"] for layer in layers)}


class BloomFilter:
    """A Redis Bloom filter used directly (sync redis-py client, or cluster)."""

    #: Fingerprints per script call: one call holds Redis for its whole list,
    #: so a long list is sent in slices (a 100,000-long check in one call
    #: blocked a loaded Redis for over 5 s).
    batch_size = 1000

    def __init__(self, client, meta_key: str, config: BloomConfig | None = None):
        self.client = client
        self.meta_key = meta_key
        self.config = config or BloomConfig()
        self._script = script(client, BLOOM_ADD)

    def add_many(self, fingerprints: Iterable[bytes | str]) -> list[bool]:
        """Check-and-add; True for each fingerprint that was not seen before."""
        return self._call("add", fingerprints)

    def check_many(self, fingerprints: Iterable[bytes | str]) -> list[bool]:
        """Read-only check; True for each fingerprint that is probably present."""
        return [not new for new in self._call("check", fingerprints)]

    def _call(self, mode: str, fingerprints) -> list[bool]:
        fps = [fingerprint_hex(fp) for fp in fingerprints]
        out: list[bool] = []
        for start in range(0, len(fps), self.batch_size):
            part = fps[start:start + self.batch_size]
            got = self._script(keys=[self.meta_key], args=[*self.config.args(), mode, *part])
            out.extend(bool(x) for x in got)
        return out

    def add(self, fingerprint: bytes | str) -> bool:
        """Check-and-add one fingerprint; True when it is new."""
        return self.add_many([fingerprint])[0]

    def meta(self) -> dict:
        """The layer table (the meta hash) as strings."""
        return {_s(k): _s(v) for k, v in self.client.hgetall(self.meta_key).items()}

    def estimates(self) -> dict:
        """Fill ratio and false-positive estimates (see :func:`filter_estimates`)."""
        return filter_estimates(self.meta())

    def shard_keys(self) -> list[str]:
        """Every shard key, including shards of the next layer made ahead."""
        return shard_keys(self.meta_key, self.meta())

    def clear(self) -> None:
        """Delete the layer table and every shard."""
        # Shards first: until the meta key goes, it still lists what is left.
        # One key per DELETE, which any cluster client accepts.
        for key in [*self.shard_keys(), self.meta_key]:
            self.client.delete(key)


