"""How many items a spider has stored in MongoDB, for the dashboard: the total
an operator asks for once the nodes (and their counters) are gone.

Read with the project's MongoDB settings as the pipeline reads them (setting,
else environment variable, else default: ``MONGO_URI``, ``MONGO_DATABASE``,
``MONGO_COLLECTION``), an estimated count (collection metadata: O(1), no
scan), at most every :data:`COUNT_EVERY` seconds, in a thread of its own (the
page shows the last count; the Redis read never waits for MongoDB); an
unreachable server is said on the page and asked again only after
:data:`RETRY_AFTER` seconds. Neither the
URI nor its credentials reach the page: only the database and collection.
"""

from __future__ import annotations

import threading
import time

from crawlproject.connection import (mongo_client_options, mongo_collection_pattern,
                                     mongo_database_from_settings, mongo_uri_from_settings)
from crawlproject.defaults import setting

COUNT_EVERY = 5.0
RETRY_AFTER = 30.0
#: longest a count waits for the server (then the page says why it has none)
TIMEOUT_MS = 1500


class StoredItems:
    """The stored-items count of one spider (``read()``: a JSON-safe dict)."""

    def __init__(self, settings, spider: str):
        self.enabled = bool(setting(settings, "MONGO_PIPELINE_ENABLED"))
        pattern = mongo_collection_pattern(settings)
        self.per_item = "%(item)" in pattern
        try:   # (as the pipeline names it; a pattern it cannot fill is said on the page)
            self.collection = "" if self.per_item else pattern % {"spider": spider, "item": ""}
        except (KeyError, ValueError, TypeError) as exc:
            self.collection, self.bad_pattern = "", f"MONGO_COLLECTION {pattern!r}: {exc!r}"
        else:
            self.bad_pattern = ""
        self.database = mongo_database_from_settings(settings)
        self._uri = mongo_uri_from_settings(settings)
        self._options = mongo_client_options(settings)
        self._where = f"{self.database}.{self.collection}"
        self._client = None
        self._counting: threading.Thread | None = None
        self._last: dict | None = None
        self._at = float("-inf")   # monotonic time of the last count (never 0.0: boot time)

    def read(self) -> dict:
        """``{"items": n or None, "where": "database.collection", "error": text}``."""
        if not self.enabled:
            return {"items": None, "where": "", "error": "MONGO_PIPELINE_ENABLED is off"}
        if self.bad_pattern:
            return {"items": None, "where": self.database, "error": self.bad_pattern}
        if self.per_item:
            return {"items": None, "where": self.database,
                    "error": "one collection per item type (MONGO_COLLECTION has %(item)s)"}
        if self._last is None or time.monotonic() - self._at >= (
                RETRY_AFTER if self._last.get("error") else COUNT_EVERY):
            self._start_count()
        return self._last or {"items": None, "where": self._where, "error": None}

    def _start_count(self) -> None:
        # In a thread of its own: a MongoDB that does not answer must not hold
        # up the Redis read (every page waited 1.5 s for a server that is not there).
        if self._counting is not None and self._counting.is_alive():
            return
        self._at = time.monotonic()
        self._counting = threading.Thread(target=self._count, daemon=True,
                                          name="dashboard-stored-items")
        self._counting.start()

    def _count(self) -> None:
        try:
            if self._client is None:
                import pymongo

                self._client = pymongo.MongoClient(
                    self._uri, **{**self._options, "serverSelectionTimeoutMS": TIMEOUT_MS,
                                  "connectTimeoutMS": TIMEOUT_MS})
            count = self._client[self.database][self.collection].estimated_document_count(
                maxTimeMS=TIMEOUT_MS)
            self._last = {"items": int(count), "where": self._where, "error": None}
        except Exception as exc:  # noqa: BLE001 - any failure is shown, never raised
            # (the type only: a driver's message may name the server and its user)
            self._last = {"items": None, "where": self._where,
                          "error": f"MongoDB: {type(exc).__name__}"}
        self._at = time.monotonic()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
