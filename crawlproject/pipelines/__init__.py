"""Item pipelines, one module per component.

* :mod:`.validation` – :class:`~.validation.ValidationPipeline`: drops items
  that break their schema, counting reasons (runs first).
* :mod:`.mongo` – :class:`~.mongo.MongoPipeline`: buffered, idempotent bulk
  writes to MongoDB, retried and spooled through outages.
* :mod:`.documents` – items to BSON documents, content hashes, the
  idempotent insert/upsert forms and the spool line format.
* :mod:`.spool` – :class:`~.spool.Spool`: the local append-only spool files.
* :mod:`.errors` – which MongoDB errors are transient; password scrubbing.

See ``docs/pipelines.md``.
"""
