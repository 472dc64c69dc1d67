"""Writes: open files and where their bytes wait for the commit.

State this package owns:

- the open files (:class:`~n5fs.gateway.write.handles.OpenFiles`): one *node* per open key
  (the staged bytes every handle of that name shares, whether it was stored, whether its
  commit failed) and the handle numbers the kernel holds;
- the staged bytes (:class:`~n5fs.gateway.write.staging.StagedFile`): a copy-on-write
  overlay on the stored object, in memory under one
  :class:`~n5fs.gateway.write.staging.StagingBudget` for the whole mount (and every view over
  it), spilling to a sparse temp file;
- the failed creates (:class:`~n5fs.gateway.write.handles.FailedCreates`): new names whose
  commit was refused, so a later ``stat`` does not show a file nobody stored.

The calls on a file's content, open to release, are :class:`~n5fs.gateway.write.filecalls.
FileCalls`; the commit at the end of them belongs to :mod:`n5fs.gateway.commit`.

Locks, in the gateway's order (see :mod:`n5fs.gateway`): a node's ``lock`` is the first lock
a write takes, and it is held across the node's content changes and its commit; a rename or a
link takes two node locks in key order (:meth:`~n5fs.gateway.write.handles.OpenFiles.pinned`).
The node table, the handle table and the staging budget are leaf locks.
"""
