"""The spool files, the document helpers and error classification (no server)."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from decimal import Decimal

import pytest
from bson.decimal128 import Decimal128
from pymongo.errors import (
    AutoReconnect,
    DuplicateKeyError,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    ServerSelectionTimeoutError,
)

from crawlproject.pipelines.documents import (
    WriteOp,
    content_hash,
    decimal128,
    from_spool_line,
    insert_document,
    to_mongo,
    to_spool_line,
)
from crawlproject.pipelines.errors import Scrubber, classify_write_error, is_transient
from crawlproject.pipelines.spool import Spool, read_segment, target_dir

SEEN = datetime(2025, 3, 4, 5, 6, 7, 123000, tzinfo=timezone.utc)


def op(i: int, **fields) -> WriteOp:
    values = {"url": f"http://x/{i}", "price": Decimal128("1299.00"), "n": i, "ratio": 0.5,
              "when": SEEN, "tags": ["a", "b"], "nested": {"b": 1, "a": [1, 2]}, **fields}
    return WriteOp.build("db", "coll", "url", values, seen=SEEN)


# ----------------------------------------------------------------------------- documents


def test_spool_lines_round_trip_exactly():
    original = op(1, big=2**40, none=None, text="$literal ünïcode\n")
    back = from_spool_line(to_spool_line(original))
    assert back == original
    assert type(back.fields["n"]) is int and type(back.fields["ratio"]) is float
    assert back.fields["when"] == SEEN and back.fields["when"].tzinfo is not None
    assert back.fields["price"] == Decimal128("1299.00")
    assert content_hash(back.fields) == original.hash
    with pytest.raises(ValueError):
        from_spool_line('{"db": "x"}')
    with pytest.raises(ValueError):
        from_spool_line("not json")


def test_content_hash_ignores_key_order_but_not_values():
    a = {"url": "u", "title": "t", "nested": {"x": 1, "y": [1, {"b": 2, "a": 1}]}}
    b = {"nested": {"y": [1, {"a": 1, "b": 2}], "x": 1}, "title": "t", "url": "u"}
    assert content_hash(a) == content_hash(b)
    assert content_hash(a) != content_hash({**a, "title": "T"})
    assert content_hash({"p": Decimal128("1.50")}) != content_hash({"p": Decimal128("1.5")})


def test_fast_decimal128_matches_bson():
    rnd = random.Random(7)
    values = [Decimal("0"), Decimal("-0"), Decimal("0.00"), Decimal("-12.5"), Decimal("9" * 34),
              Decimal("9" * 35), Decimal("1E+6111"), Decimal("1E+6112"), Decimal("1E-6176"),
              Decimal("Infinity"), Decimal("-Infinity"), Decimal("NaN")]
    values += [Decimal(f"{rnd.choice('-+')}{rnd.randint(0, 10 ** rnd.randint(1, 36))}"
                       f"E{rnd.randint(-6200, 6200)}") for _ in range(3000)]
    for value in values:
        try:
            expected = Decimal128(value).bid
        except Exception as exc:  # out of range for Decimal128 either way
            with pytest.raises(type(exc)):
                decimal128(value)
            continue
        assert decimal128(value).bid == expected, value


def test_to_mongo_converts_what_bson_cannot_hold():
    from datetime import date

    out = to_mongo({"p": Decimal("1.5"), "s": {3}, "t": (1, 2), "d": date(2024, 2, 3),
                    "n": {"q": [Decimal("2")]}})
    assert out == {"p": Decimal128("1.5"), "s": [3], "t": [1, 2],
                   "d": datetime(2024, 2, 3, tzinfo=timezone.utc), "n": {"q": [Decimal128("2")]}}


def test_insert_document_and_key_as_id():
    document = insert_document(op(1))
    assert document["_id"] == "http://x/1" and document["first_seen"] == document["updated_at"]
    plain = WriteOp.build("db", "c", "url", {"url": "u", "_id": "ignored"}, key_as_id=False)
    assert "_id" not in insert_document(plain) and plain.filter == {"url": "u"}
    with pytest.raises(KeyError):
        WriteOp.build("db", "c", "url", {"url": ["not", "scalar"]})


# ----------------------------------------------------------------------------- spool


def test_append_seal_read_remove(tmp_path):
    async def run():
        spool = Spool(tmp_path, owner="me").open()
        await spool.append([op(1), op(2)])
        await spool.append([op(3)])
        assert spool.active_records == 3
        assert spool.replayable() == []  # the active segment is not replayed
        await spool.seal()
        (path,) = spool.replayable()
        segment = await spool.read(path)
        assert [o.key for o in segment.ops] == ["http://x/1", "http://x/2", "http://x/3"]
        await spool.remove(segment)
        assert spool.pending_files() == []
        spool.close()

    asyncio.run(run())
    assert not tmp_path.exists()  # an empty spool directory is removed at close


def test_lock_files_of_dead_owners_without_segments_are_swept(tmp_path):
    (tmp_path / "dead.lock").write_text("")
    spool = Spool(tmp_path, owner="me").open()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["me.lock"]
    spool.close()


def test_segments_roll_over(tmp_path):
    async def run():
        spool = Spool(tmp_path, owner="me", segment_records=2).open()
        for i in range(5):
            await spool.append([op(i)])
        assert len(spool.replayable()) == 2 and spool.active_records == 1
        spool.close()

    asyncio.run(run())
    assert len(list(tmp_path.glob("me.*.jsonl"))) == 3


def test_torn_last_line_is_ignored_and_corrupt_lines_kept_aside(tmp_path):
    path = tmp_path / "dead.000001.jsonl"
    path.write_text(to_spool_line(op(1)) + "\n{broken\n" + to_spool_line(op(2)) + "\n"
                    + to_spool_line(op(3))[:25])
    segment = read_segment(path)
    assert [o.key for o in segment.ops] == ["http://x/1", "http://x/2"]
    assert segment.corrupt_lines == 1 and segment.torn_tail

    async def run():
        spool = Spool(tmp_path, owner="me").open()
        (found,) = spool.replayable()  # no dead.lock: an orphan
        await spool.remove(await spool.read(found))
        spool.close()

    asyncio.run(run())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dead.000001.corrupt"]


HOLDER = textwrap.dedent("""
    import asyncio, sys
    from crawlproject.pipelines.spool import Spool
    from tests.test_pipeline_spool import op

    async def main():
        spool = Spool(sys.argv[1], owner="alive").open()
        await spool.append([op(1)])
        print("ready", flush=True)
        sys.stdin.readline()

    asyncio.run(main())
""")


def test_segments_of_a_live_process_are_left_alone_then_adopted_when_it_dies(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], cwd=root,
                             env={**os.environ, "PYTHONPATH": root},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        spool = Spool(tmp_path, owner="me").open()
        assert spool.replayable() == []          # its owner holds the lock
        child.kill()                              # dies without closing anything
        child.wait(10)
        (path,) = spool.replayable()
        assert path.name == "alive.000001.jsonl"
        other = Spool(tmp_path, owner="other").open()
        assert other.replayable() == []           # already adopted by "me"
        asyncio.run(spool.remove(read_segment(path)))
        assert not (tmp_path / "alive.lock").exists()
        other.close()
        spool.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_target_dir_depends_on_hosts_and_database_not_credentials(tmp_path):
    a = target_dir(tmp_path, "mongodb://u:secret@h1:27017,h2:27017/?authSource=admin", "crawl")
    b = target_dir(tmp_path, "mongodb://u:other@h1:27017,h2:27017/", "crawl")
    c = target_dir(tmp_path, "mongodb://h3:27017/", "crawl")
    d = target_dir(tmp_path, "mongodb://u:secret@h1:27017,h2:27017/", "other")
    assert a == b and len({a, c, d}) == 3
    assert "secret" not in str(a)


# ----------------------------------------------------------------------------- errors


def test_transient_errors_are_retried_and_others_are_not():
    assert is_transient(AutoReconnect("x"))
    assert is_transient(NetworkTimeout("x"))
    assert is_transient(NotPrimaryError("x", {}))
    assert is_transient(ServerSelectionTimeoutError("x"))
    assert is_transient(OperationFailure("stepdown", code=189))
    assert is_transient(OperationFailure("unauthorized", code=13))
    labelled = OperationFailure("x", code=1, details={"errorLabels": ["RetryableWriteError"]})
    assert is_transient(labelled)
    assert not is_transient(OperationFailure("bad value", code=2))
    assert not is_transient(DuplicateKeyError("dup", code=11000))
    assert not is_transient(ValueError("x"))
    assert classify_write_error({"code": 11000}) == "duplicate"
    assert classify_write_error({"code": 91}) == "transient"
    assert classify_write_error({"code": 121}) == "permanent"


def test_scrubber_removes_every_form_of_the_password():
    scrub = Scrubber("mongodb://crawler:p%40ss%2Fw%3Ard@db.example:27017/?authSource=admin")
    text = ("failed for mongodb://crawler:p%40ss%2Fw%3Ard@db.example:27017/?authSource=admin "
            "password p@ss/w:rd or p%40ss%2Fw%3Ard")
    out = scrub(text)
    assert "p@ss/w:rd" not in out and "p%40ss%2Fw%3Ard" not in out
    assert "mongodb://crawler:***@db.example:27017/" in out
    assert Scrubber("mongodb://h:1/")("nothing to hide") == "nothing to hide"


def test_a_failed_append_never_corrupts_later_records(tmp_path, monkeypatch):
    """Disk full in the middle of a write: the partial line ends its segment
    (ignored torn tail) and the next append starts a new segment."""
    import errno

    import crawlproject.pipelines.spool as spool_module

    real_write = os.write

    def half_then_full(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    async def run():
        spool = Spool(tmp_path, owner="me").open()
        await spool.append([op(1)])
        monkeypatch.setattr(spool_module.os, "write", half_then_full)
        with pytest.raises(OSError):
            await spool.append([op(2)])
        monkeypatch.setattr(spool_module.os, "write", real_write)
        await spool.append([op(3)])
        await spool.seal()
        segments = [read_segment(p) for p in spool.replayable()]
        spool.close()
        return segments

    first, second = asyncio.run(run())
    assert [o.key for o in first.ops] == ["http://x/1"] and first.torn_tail
    assert [o.key for o in second.ops] == ["http://x/3"]
    assert first.corrupt_lines == second.corrupt_lines == 0
