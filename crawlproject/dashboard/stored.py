"""How many items a spider has stored in MongoDB, for the dashboard: the total
an operator asks for once the nodes (and their counters) are gone.

Read with the project's MongoDB settings as the pipeline reads them (setting,
else environment variable, else default: ``MONGO_URI``, ``MONGO_DATABASE``,
``MONGO_COLLECTION``), an estimated count (collection metadata: O(1), no
scan), at most every :data:`COUNT_EVERY` seconds; an unreachable server is
said on the page and asked again only after :data:`RETRY_AFTER` seconds (the
reads run in the feed's worker thread; none may hold it for long). Neither the
URI nor its credentials reach the page: only the database and collection.
"""

from __future__ import annotations

import time

from crawlproject.connection import (mongo_client_options, mongo_database_from_settings,
                                     mongo_uri_from_settings)
from crawlproject.defaults import setting

COUNT_EVERY = 5.0
RETRY_AFTER = 30.0
#: longest a count may wait for the server (the dashboard's reads wait for it)
TIMEOUT_MS = 1500


class StoredItems:
    """The stored-items count of one spider (``read()``: a JSON-safe dict)."""

    def __init__(self, settings, spider: str):
        self.enabled = bool(setting(settings, "MONGO_PIPELINE_ENABLED"))
        pattern = setting(settings, "MONGO_COLLECTION")
        self.per_item = "%(item)" in pattern
        self.collection = "" if self.per_item else pattern % {"spider": spider}
        self.database = mongo_database_from_settings(settings)
        self._uri = mongo_uri_from_settings(settings)
        self._options = mongo_client_options(settings)
        self._client = None
        self._last: dict | None = None
        self._at = float("-inf")   # monotonic time of the last count (never 0.0: boot time)

    def read(self) -> dict:
        """``{"items": n or None, "where": "database.collection", "error": text}``."""
        if not self.enabled:
            return {"items": None, "where": "", "error": "MONGO_PIPELINE_ENABLED is off"}
        if self.per_item:
            return {"items": None, "where": self.database,
                    "error": "one collection per item type (MONGO_COLLECTION has %(item)s)"}
        wait = RETRY_AFTER if self._last and self._last.get("error") else COUNT_EVERY
        if self._last is not None and time.monotonic() - self._at < wait:
            return self._last
        self._at = time.monotonic()
        where = f"{self.database}.{self.collection}"
        try:
            if self._client is None:
                import pymongo

                self._client = pymongo.MongoClient(
                    self._uri, **{**self._options, "serverSelectionTimeoutMS": TIMEOUT_MS,
                                  "connectTimeoutMS": TIMEOUT_MS})
            count = self._client[self.database][self.collection].estimated_document_count(
                maxTimeMS=TIMEOUT_MS)
            self._last = {"items": int(count), "where": where, "error": None}
        except Exception as exc:  # noqa: BLE001 - any failure is shown, never raised
            # (the type only: a driver's message may name the server and its user)
            self._last = {"items": None, "where": where,
                          "error": f"MongoDB: {type(exc).__name__}"}
        return self._last

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
