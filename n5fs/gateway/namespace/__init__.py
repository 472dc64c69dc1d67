"""The namespace a mount shows: names, folders and what each entry is.

State this package owns:

- the folder listings (:class:`~n5fs.gateway.namespace.listings.NamespaceView`): a
  single-flight cache of immutable listings, patched by every commit so a committed name is
  visible the moment the commit returns; directories that live only in the gateway (made by
  ``mkdir``, not yet holding a key); files being written shown beside what is stored;
- the walks (:mod:`~n5fs.gateway.namespace.walks`): one flat listing of an array answers every
  folder of its chunk tree where the store prefers that (S3, zip, memory), on the gateway's
  walk pool (:class:`~n5fs.workers.Workers`);
- links (:mod:`~n5fs.gateway.namespace.links`): hdmf-zarr's same-store links shown as symlinks;
- the control entries under ``/.n5fs/`` (:mod:`~n5fs.gateway.namespace.control`): what the
  mount reports about itself;
- paths and keys (:mod:`~n5fs.gateway.namespace.paths`): the one translation between a FUSE
  path and a store key, and the attributes an entry shows.

Locks: the listing cache, the virtual-directory table and the walk table are leaf locks of the
gateway's order (see :mod:`n5fs.gateway`); LISTs run outside every lock and are shared between
the threads that miss the same folder; the walk workers take no gateway lock at all.
"""
