"""Spool: a local append-only file of writes MongoDB could not take yet.

When MongoDB stays unreachable, :class:`~crawlproject.pipelines.mongo.MongoPipeline`
appends the batch here (one line of extended JSON per item, see
:func:`~crawlproject.pipelines.documents.to_spool_line`) and ``fsync``\\ s it
before telling Scrapy the items are done. The lines are replayed into MongoDB
when it answers again, by the next node started on this machine, or by
``python -m crawlproject.cli spool-replay``; a node that has to close while
MongoDB is still down hands them to Redis (:mod:`.handoff`).

Layout of a spool directory (one per MongoDB target, see :func:`target_dir`)::

    <owner>.lock            held (flock) by the live process <owner>
    <owner>.000001.jsonl    segments, append-only; a full or sealed segment is
    <owner>.000002.jsonl    followed by the next number

* Only the owner appends to its segments. A segment is never modified after
  it is sealed; it is deleted after every line in it was written to MongoDB.
* Segments whose owner is gone (its ``.lock`` is not locked, or missing) are
  *orphans*: any process adopts them (taking the lock first, so only one
  does) and replays them. Replays are idempotent upserts, so a segment
  replayed twice (a crash between the write and the delete) is harmless.
* A line cut short by a crash was never acknowledged (the ``fsync`` did not
  return), so it is ignored; a malformed line elsewhere is reported and the
  segment kept as ``.corrupt`` for inspection.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import hashlib
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from scrapy.utils.conf import closest_scrapy_cfg, get_config
from scrapy.utils.project import inside_project

from crawlproject.node import new_node_id
from crawlproject.pipelines.documents import WriteOp, from_spool_line, to_spool_line

__all__ = ["Spool", "Segment", "target_dir", "spool_path", "read_segment", "count_records"]

logger = logging.getLogger(__name__)

SEGMENT_RE = re.compile(r"^(?P<owner>[A-Za-z0-9_-]+)\.(?P<seq>\d{6,})\.jsonl$")
DEFAULT_SEGMENT_RECORDS = 10_000


def spool_path(setting: str | os.PathLike) -> Path:
    """``MONGO_SPOOL_DIR`` as a path: relative paths are under the project's
    data directory (``.scrapy/``, or ``[datadir]`` in scrapy.cfg), as with
    ``scrapy.utils.project.data_path`` but without its mkdir, which races
    when two nodes start at once on a fresh machine. Created on open."""
    path = Path(setting)
    if path.is_absolute():
        return path
    if inside_project():
        config = get_config()
        project = os.environ.get("SCRAPY_PROJECT", "default")
        if config.has_option("datadir", project):
            return Path(config.get("datadir", project), path)
        scrapy_cfg = closest_scrapy_cfg()
        if scrapy_cfg:
            return (Path(scrapy_cfg).parent / ".scrapy").resolve() / path
    return Path(".scrapy", path)


def target_dir(base: str | os.PathLike, uri: str, database: str) -> Path:
    """The spool directory for a MongoDB target: ``<base>/<database>-<hash of hosts>``.

    Only a node writing to the same hosts and database replays a spool, so a
    spool never lands in another deployment. The hash excludes credentials.
    """
    try:
        hosts = urlsplit(uri).netloc.rpartition("@")[2]
    except ValueError:
        hosts = ""
    digest = hashlib.sha1(hosts.encode()).hexdigest()[:10]
    safe_db = re.sub(r"[^A-Za-z0-9_-]", "_", database)
    return Path(base) / f"{safe_db}-{digest}"


@dataclass
class Segment:
    """One spool file and what reading it found."""

    path: Path
    ops: list[WriteOp] = field(default_factory=list)
    corrupt_lines: int = 0
    torn_tail: bool = False


class Spool:
    """Append-only spool files in *directory*, owned by this process.

    :meth:`open` takes this process's lock; :meth:`append` writes and fsyncs
    (in a thread); :meth:`seal` closes the segment being written so it can be
    replayed; :meth:`replayable` lists the sealed segments of this process and
    the orphans of dead ones; :meth:`read` and :meth:`remove` handle one of
    them; :meth:`close` releases everything. ``lock`` (an ``asyncio.Lock``)
    serialises appends and seals: hold it to make a decision atomic with them.
    """

    def __init__(self, directory: str | os.PathLike, owner: str | None = None,
                 segment_records: int = DEFAULT_SEGMENT_RECORDS):
        self.directory = Path(directory)
        # A node passes its id (crawlproject.node.node_id): file-name safe.
        self.owner = owner or new_node_id()
        self.segment_records = segment_records
        self.lock = asyncio.Lock()
        self._lock_fd: int | None = None
        self._active_fd: int | None = None
        self._active_path: Path | None = None
        self._active_records = 0
        self._seq = 0
        self._sealed: list[Path] = []
        self._adopted: dict[str, int] = {}  # owner -> fd of its lock file

    # -- lifecycle ---------------------------------------------------------
    def open(self) -> "Spool":
        """Create the directory and take this owner's lock file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.owner}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._lock_fd = fd
        _fsync_dir(self.directory)
        self._sweep_stale_locks()
        return self

    def _sweep_stale_locks(self) -> None:
        """Delete the lock files of dead owners that left no segment."""
        for path in self.directory.glob("*.lock"):
            owner = path.name[:-len(".lock")]
            if owner == self.owner or self._segments_of(owner):
                continue
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue  # alive
            try:
                if not self._segments_of(owner):
                    os.unlink(path)
            except OSError:
                pass
            finally:
                os.close(fd)

    def close(self) -> None:
        """Close the active segment and release the locks.

        The lock files of owners whose segments are all gone are deleted; a
        process whose own segments remain leaves them as orphans for the next
        process to replay.
        """
        self._close_active()
        for owner, fd in list(self._adopted.items()):
            self._release_owner(owner, fd)
        self._adopted.clear()
        if self._lock_fd is not None:
            self._release_owner(self.owner, self._lock_fd)
            self._lock_fd = None
            try:
                self.directory.rmdir()  # only when empty
            except OSError:
                pass

    def _release_owner(self, owner: str, fd: int) -> None:
        if not self._segments_of(owner):
            try:
                os.unlink(self.directory / f"{owner}.lock")
            except FileNotFoundError:
                pass
        os.close(fd)  # releases the flock

    # -- writing -----------------------------------------------------------
    @property
    def active_records(self) -> int:
        """Records in the segment being written (not yet sealed)."""
        return self._active_records

    async def append(self, ops: list[WriteOp]) -> None:
        """Append *ops* and fsync them (takes :attr:`lock`)."""
        async with self.lock:
            await self.append_locked(ops)

    async def append_locked(self, ops: list[WriteOp]) -> None:
        """:meth:`append` for a caller that already holds :attr:`lock`."""
        if not ops:
            return
        data = "".join(to_spool_line(op) + "\n" for op in ops).encode("utf-8")
        await asyncio.to_thread(self._write_sync, data, len(ops))

    def _write_sync(self, data: bytes, count: int) -> None:
        if self._active_fd is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._seq += 1
            path = self.directory / f"{self.owner}.{self._seq:06d}.jsonl"
            self._active_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._active_path = path
            self._active_records = 0
            _fsync_dir(self.directory)
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._active_fd, view)
                view = view[written:]
            os.fsync(self._active_fd)
        except OSError:
            # Disk full, I/O error: part of *data* may be in the file. Never
            # append after it (a later record would share its line): end the
            # segment here, the partial line is its ignored torn tail.
            self._abandon_active()
            raise
        self._active_records += count
        if self._active_records >= self.segment_records:
            self._seal_sync()

    def _abandon_active(self) -> None:
        path, records = self._active_path, self._active_records
        self._close_active()
        if path is None:
            return
        if records:
            self._sealed.append(path)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass

    async def seal(self) -> None:
        """Close the segment being written, if any, so it can be replayed."""
        async with self.lock:
            self._seal_sync()

    def _seal_sync(self) -> None:
        if self._active_path is not None:
            path = self._active_path
            self._close_active()
            self._sealed.append(path)

    def _close_active(self) -> None:
        if self._active_fd is not None:
            os.close(self._active_fd)
        self._active_fd = None
        self._active_path = None
        self._active_records = 0

    # -- replaying ---------------------------------------------------------
    def replayable(self) -> list[Path]:
        """Sealed segments of this process, then those of dead owners (adopted now)."""
        own = [p for p in self._sealed if p.exists()]
        self._sealed = own
        return own + self._orphan_segments()

    def _segments_of(self, owner: str) -> list[Path]:
        found = []
        for path in self.directory.glob(f"{owner}.*.jsonl"):
            match = SEGMENT_RE.match(path.name)
            if match and match["owner"] == owner:
                found.append(path)
        return sorted(found)

    def _orphan_segments(self) -> list[Path]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        owners = set()
        for name in names:
            match = SEGMENT_RE.match(name)
            if match:
                owners.add(match["owner"])
        found: list[Path] = []
        for owner in sorted(owners):
            if owner == self.owner:
                continue
            if owner in self._adopted or self._try_adopt(owner):
                found += self._segments_of(owner)
        return found

    def _try_adopt(self, owner: str) -> bool:
        path = self.directory / f"{owner}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                logger.warning("Cannot lock %s: %s", path, exc)
            return False  # its owner is alive
        self._adopted[owner] = fd
        logger.info("Adopted spool segments of %s (a process that stopped)", owner)
        return True

    async def read(self, path: Path) -> Segment:
        """Parse a segment (in a thread)."""
        return await asyncio.to_thread(read_segment, path)

    async def remove(self, segment: Segment) -> None:
        """Delete a replayed segment (kept as ``.corrupt`` if it had bad lines)."""
        await asyncio.to_thread(self._remove_sync, segment)

    def _remove_sync(self, segment: Segment) -> None:
        if segment.corrupt_lines:
            os.replace(segment.path, segment.path.with_suffix(".corrupt"))
        else:
            try:
                os.unlink(segment.path)
            except FileNotFoundError:
                pass
        _fsync_dir(self.directory)
        if segment.path in self._sealed:
            self._sealed.remove(segment.path)
        match = SEGMENT_RE.match(segment.path.name)
        owner = match["owner"] if match else None
        if owner in self._adopted and not self._segments_of(owner):
            self._release_owner(owner, self._adopted.pop(owner))

    def pending_files(self) -> list[Path]:
        """Every segment in the directory (any owner): empty when all was replayed."""
        try:
            return sorted(p for p in self.directory.iterdir() if SEGMENT_RE.match(p.name))
        except FileNotFoundError:
            return []


def read_segment(path: Path) -> Segment:
    """Parse the lines of a spool segment (see the module docstring on bad lines)."""
    segment = Segment(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return segment
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: empty, or a line cut short
    if tail.strip():
        segment.torn_tail = True
        logger.warning("Ignoring an incomplete last line in %s (never acknowledged)", path)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            segment.ops.append(from_spool_line(line.decode("utf-8")))
        except (ValueError, UnicodeDecodeError) as exc:
            segment.corrupt_lines += 1
            logger.error("Malformed line %d in %s: %s", number, path, exc)
    return segment


def count_records(paths: list[Path]) -> int:
    """Complete lines in the segments *paths* (blocking: call it in a thread)."""
    total = 0
    for path in paths:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        total += sum(1 for line in data.split(b"\n")[:-1] if line.strip())
    return total


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
