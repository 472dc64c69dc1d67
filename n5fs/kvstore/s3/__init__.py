"""The S3 driver: :class:`S3Store`, a bucket and prefix of S3 or an S3-compatible server,
through boto3. Only this package imports boto3 or botocore.

Modules have plain names, no leading underscores: the package's public surface is what this
file exports (``__all__``), and the modules are named by what they own because tests replace
their attributes (``uploads.now``), docstrings cite them and log records carry their names.
Nothing outside the package imports them, tests aside.

- ``store``: :class:`S3Store`: which requests a store call makes, keys, timestamps,
  conditional writes;
- ``client``: the boto3 client: endpoint, credentials, timeouts, the connection pool;
- ``retries``: the one retry policy, the silent-endpoint breaker, the throttle;
- ``lean``: GetObject past botocore's request pipeline, on the route botocore's first GET
  took (the same request and signature at a fraction of the CPU);
- ``leanlist``: ListObjectsV2 likewise, on the route of botocore's first LIST, its pages
  parsed by ElementTree as botocore parses them (checked once against botocore's parse);
- ``errors``: boto3/botocore failures as n5fs's error classes;
- ``integrity``: bytes acknowledged only once stored exactly, read only once checked;
- ``conditional``: ``If-Match``/``If-None-Match`` refusals, and the probe of an endpoint;
- ``uploads``: multipart uploads and the local journal of those in flight;
- ``leftovers``: what killed writers leave in a bucket, found and removed;
- ``headers``: the ``mtime`` metadata and the headers a server-side copy keeps;
- ``times``: kept times that a LIST shows, from one hidden index object per folder.

State and locks (each a leaf lock: none is taken while another is held, none is held across
a request; the one exception is the times' ``_flush_lock``, below):

- :class:`S3Store` ``_pool_lock`` guards the thread pool shared by ``get_many``, multipart
  parts and ``copy_many`` (made on first use, swapped out at ``close``); the boto3 client is
  thread-safe and belongs to its store.
- :class:`~n5fs.kvstore.s3.leftovers.S3Leftovers` ``_lock`` guards ``_reported``, the
  uploads behind each leftover reported; table work only.
- :class:`~n5fs.kvstore.s3.retries.SilentEndpoint` ``_lock`` guards ``_silent_until``,
  ``_since`` and ``_probing``; :class:`~n5fs.kvstore.s3.retries.Throttle` ``_lock`` guards its
  rate and tokens, and a request waiting for a token sleeps outside it;
  :class:`~n5fs.kvstore.s3.retries.RetryPolicy` keeps per-request counters in the request's
  botocore context (one request, one thread: no lock); the lean GETs' and LISTs' routes
  are set once and replaced whole, read without a lock, as is the LISTs' ``checked`` flag
  (and a thread-local holds what a botocore request is about while it runs); the store's
  :class:`~n5fs.kvstore.s3.retries.Tally` of handled faults (``stats.json``) has its own lock,
  held for one addition.
- ``uploads._LOCK``, one per process, serialises every journal change of this process (the
  appends and rewrites of journal files happen under it); each process appends only to its
  own journal file and a sweeper rewrites only dead writers' files, so no two processes write
  one file at once. ``uploads.now`` is the clock leftovers are aged by (tests replace it).
- :class:`~n5fs.kvstore.s3.times.KeptTimes` ``_lock`` (a leaf) guards the indexes seen and
  read and the edits not yet written; ``_flush_lock`` serializes the writes of indexes and is
  held across their requests, taken before ``_lock`` and by nothing but the flusher thread,
  ``flush``, ``close`` and the removals of prefixes (no other lock of this package is held
  while it is taken; a caller's may be, and nothing under it calls back out of the store).
- ``client``, ``conditional``, ``errors``, ``headers`` and ``integrity`` are stateless.
"""

from __future__ import annotations

from n5fs.kvstore.s3.store import MiB, S3Store, error_code, translate

__all__ = ["MiB", "S3Store", "error_code", "translate"]
