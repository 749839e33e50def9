"""Item pipelines, one module per component.

* :mod:`.validation` – :class:`~.validation.ValidationPipeline`: drops items
  that break their schema, counting reasons (runs first).
* :mod:`.mongo` – :class:`~.mongo.MongoPipeline`: buffered, idempotent bulk
  writes to MongoDB, retried and spooled through outages; holds the idle
  close while MongoDB is down (``MONGO_CLOSE_WAIT``). The Scrapy adapter over:
* :mod:`.config` – :class:`~.config.MongoConfig`: the ``MONGO_*`` settings,
  read once, given to the pipeline and its outage handling.
* :mod:`.batcher` – :class:`~.batcher.Batcher`: group commit (batches by
  size, age and idleness, bounded writes in flight), knows no database.
* :mod:`.outage` – :class:`~.outage.OutageHandler`: where a batch goes
  (MongoDB or the spool), the probe and replay that end an outage, the close
  wait (``mongo_unavailable``) and the handoff of a spool to Redis at close.
* :mod:`.writer` – :class:`~.writer.MongoWriter`: the bulk writes and their
  retries, usable without a crawler.
* :mod:`.documents` – items to BSON documents, content hashes, the
  idempotent insert/upsert forms and the spool line format.
* :mod:`.spool` – :class:`~.spool.Spool`: the local append-only spool files.
* :mod:`.handoff` – :class:`~.handoff.RedisHandoff`: a spool handed to Redis
  by a node that closed while MongoDB was down, for any node to store.
* :mod:`.replay` – replaying spools, with or without a crawl
  (:func:`~.replay.replay_spool`, ``python -m crawlproject.cli spool-replay``).
* :mod:`.errors` – which MongoDB errors are transient; password scrubbing.

See ``docs/pipelines.md``.
"""
