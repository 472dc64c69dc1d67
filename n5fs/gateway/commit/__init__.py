"""Commits: whether new bytes may be stored, storing them in order, and everything a commit
changes afterwards.

State this package owns:

- the rules (:mod:`~n5fs.gateway.commit.rules`): classify a key under its folder's format and
  validate its bytes against the store as it is now; nothing there writes;
- the commit order (:class:`~n5fs.gateway.commit.ordering.ArrayOrder`): a commit holds every
  folder above its key shared, a metadata commit holds its own folder exclusive, so chunk
  commits of one array run in parallel and a metadata commit excludes them;
- the checks that run while a chunk is written (:mod:`~n5fs.gateway.commit.prevalidate`, fed
  by the streaming decoders of :mod:`~n5fs.gateway.commit.streamcheck`) and the pool that
  validates the chunks a new metadata file makes chunks of (:mod:`~n5fs.gateway.commit.pool`),
  both on pools of the gateway's :class:`~n5fs.workers.Workers`;
- many mounts of one bucket: compare-and-swap metadata commits
  (:mod:`~n5fs.gateway.commit.conditional`) and consolidated documents kept true
  (:mod:`~n5fs.gateway.commit.consolidated`);
- the rejections, the counters and the change subscribers
  (:class:`~n5fs.gateway.commit.committer.Committer`);
- renames, hard links and symlinks, the commits that move content to a new name
  (:mod:`~n5fs.gateway.commit.renames`).

Locks, in the gateway's order (see :mod:`n5fs.gateway`): callers hold the node lock of what
they commit; then the commit-order folder locks (one ``hold`` per thread, all folders of one
operation at once, in sorted prefix order); then the consolidated-metadata lock (one
read-modify-write of a consolidated document at a time); the rejections, subscribers and
counters are leaf locks. Store first, then caches patched and invalidated while the hold is
still held.
"""
