"""Local chunks read and judged in worker processes: ``n5fs validate`` on a local disk.

Why processes: a small chunk on a local disk costs three system calls and a check of a few
microseconds. With threads, each return from a system call waits for the GIL, which the
thread that lists and classifies holds most of the time (and the other workers the rest):
on two cores, two worker threads did less than one. A worker process reads and judges a
whole batch holding no lock anyone else wants; the parent lists, classifies, and counts.

What goes over the pipes: the parent sends a batch, a list of :class:`Group` (the names of
chunks of one folder, their grid positions, the folder's local path as the store resolved it,
and a token for the array that judges them), plus each array not sent to that worker before;
the worker answers each batch, in order, with one :class:`Outcome`: counts, the findings
(keys in full), and the indexes of the chunks it could not open or read, which the parent
asks of the store's ``get`` (a link, a file gone: ``get`` decides, as for every read). A
check that fails with anything but a finding (a bug) is sent back and raised by the parent,
where it ends the run as it would in a thread.

Start: a fresh interpreter running :func:`main`, with the parent's ``sys.path``, talking over
two pipes whose descriptors it is given. Never a ``fork`` of the parent, whose other threads
may hold locks; and not :mod:`multiprocessing`'s ``spawn`` or ``forkserver`` either, which
import the parent's ``__main__`` again in the worker (a script or a command line tool
without a ``__main__`` guard would run once more in each). Starting costs about a second
(imports), so the checker asks for processes only once a run is large (:mod:`.chunks`).

Failure: a worker that dies (killed, crashed in a decoder) ends the run with
:class:`WorkerDied`, naming the first chunk of the batch it held: its chunks were not checked,
and nothing is called valid. Workers ignore SIGINT (the parent decides) and exit when their
pipe closes, so none outlives a parent that is gone.

Lock discipline: a :class:`Workers` is used by one thread (the listing's); no locks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import traceback
from collections import deque
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for
from typing import TYPE_CHECKING, Any, NamedTuple

from n5fs.errors import N5fsError
from n5fs.malloc import reuse_large_buffers
from n5fs.validate.check import DIR_FLAGS, GUESS, judge, read_file
from n5fs.validate.report import Finding

if TYPE_CHECKING:
    from n5fs.formats.base import ArrayNode

#: batches sent to one worker and not answered yet: one to work on, one waiting in its pipe
DEPTH = 2
#: seconds a closing parent waits for each worker to exit before it is killed
EXIT_WAIT = 5.0
#: what a worker interpreter runs: the parent's ``sys.path``, then :func:`main`
_BOOT = (
    "import sys; sys.path[:] = sys.argv[3:]; "
    "from n5fs.validate.procs import main; main(int(sys.argv[1]), int(sys.argv[2]))"
)


class WorkerDied(N5fsError):
    """A worker process ended while it held chunks: they were not checked."""


class Group(NamedTuple):
    """Chunks of one folder: ``names`` relative to ``path`` (the folder's local directory),
    keys ``prefix + name``, judged by the array ``token`` stands for."""

    prefix: str
    path: str
    token: int
    names: list[str]
    positions: list[tuple[int, ...]]


class Outcome(NamedTuple):
    """One batch done: ``count`` chunks judged or unreadable (``nbytes`` read), and the indexes
    (over the batch's groups in order) of the ones left to the store's ``get``."""

    count: int
    nbytes: int
    invalid: list[Finding]
    unreadable: list[Finding]
    retry: list[int]


class _Failed(NamedTuple):
    """A check raised what no verdict covers: the error and its traceback, for the parent."""

    error: BaseException
    trace: str


class RemoteTraceback(Exception):
    """The traceback of an error raised in a worker process (the ``__cause__`` of its copy)."""


def check_batch(groups: list[Group], arrays: dict[int, ArrayNode]) -> Outcome:
    """Read and judge every chunk of ``groups``, one at a time (one chunk's bytes held)."""
    count = nbytes = index = 0
    invalid: list[Finding] = []
    unreadable: list[Finding] = []
    retry: list[int] = []
    for group in groups:
        array = arrays[group.token]
        try:
            directory = os.open(group.path, DIR_FLAGS)
        except OSError:
            retry.extend(range(index, index + len(group.names)))
            index += len(group.names)
            continue
        try:
            prefix = group.prefix
            for name, position in zip(group.names, group.positions, strict=True):
                data = read_file(directory, name, GUESS)
                if data is None:
                    retry.append(index)
                else:
                    count += 1
                    nbytes += len(data)
                    verdict = judge(array, prefix + name, position, data)
                    if verdict is not None:
                        (unreadable if verdict.unreadable else invalid).append(verdict.finding)
                index += 1
        finally:
            os.close(directory)
    return Outcome(count, nbytes, invalid, unreadable, retry)


def main(inbox: int, outbox: int) -> None:
    """A worker's life: batches in on descriptor ``inbox``, outcomes out on ``outbox``, until
    the pipe closes (the parent is gone) or says stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt ends
    reuse_large_buffers()  # a batch job, as the parent (n5fs.malloc)
    import n5fs.formats.registry  # noqa: F401  (every format: what the arrays sent need)

    serve(Connection(inbox, writable=False), Connection(outbox, readable=False))


def serve(inbox: Connection, outbox: Connection) -> None:
    arrays: dict[int, ArrayNode] = {}
    while True:
        try:
            message = inbox.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        groups, new = message
        arrays.update(new)
        answer: Outcome | _Failed
        try:
            answer = check_batch(groups, arrays)
        except Exception as exc:
            answer = _Failed(exc, traceback.format_exc())
        try:
            outbox.send(answer)
        except (OSError, ValueError):
            return
        except Exception as exc:  # the error would not pickle: its text instead
            outbox.send(_Failed(RuntimeError(repr(answer)), str(exc)))


class Workers:
    """``count`` worker processes; batches go to the least busy one. From one thread.

    :meth:`submit` and :meth:`collect` give back the outcomes that came in, each with the
    tag its batch was submitted with."""

    def __init__(self, count: int) -> None:
        self._sends: list[Connection] = []
        self._recvs: list[Connection] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        #: tags of the batches each worker holds, oldest first
        self._held: list[deque[object]] = []
        #: the array tokens each worker has
        self._known: list[set[int]] = []
        try:
            for _ in range(max(1, count)):
                self._spawn()
        except BaseException:
            self.close()
            raise

    def _spawn(self) -> None:
        if not sys.executable:
            raise OSError("no Python interpreter to start workers with")
        theirs_in, ours_out = os.pipe()
        ours_in, theirs_out = os.pipe()
        try:
            argv = [sys.executable, "-c", _BOOT, str(theirs_in), str(theirs_out), *sys.path]
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, pass_fds=(theirs_in, theirs_out), close_fds=True
            )
        except BaseException:
            for fd in (ours_out, ours_in):
                os.close(fd)
            raise
        finally:
            os.close(theirs_in)
            os.close(theirs_out)
        self._sends.append(Connection(ours_out, readable=False))
        self._recvs.append(Connection(ours_in, writable=False))
        self._procs.append(proc)
        self._held.append(deque())
        self._known.append(set())

    @property
    def busy(self) -> bool:
        """Does some worker hold a batch?"""
        return any(self._held)

    def submit(
        self, tag: object, groups: list[Group], arrays: dict[int, ArrayNode]
    ) -> list[tuple[object, Outcome]]:
        """Send a batch (the arrays its groups name among ``arrays``) to the least busy worker,
        first waiting while every worker holds :data:`DEPTH`; return what came in meanwhile."""
        done = self.collect(block=False)
        while min(len(held) for held in self._held) >= DEPTH:
            done += self.collect(block=True)
        worker = min(range(len(self._held)), key=lambda i: len(self._held[i]))
        known = self._known[worker]
        new = {g.token: arrays[g.token] for g in groups if g.token not in known}
        self._sends[worker].send((groups, new))
        known.update(new)
        self._held[worker].append(tag)
        return done

    def collect(self, *, block: bool) -> list[tuple[object, Outcome]]:
        """The outcomes in now (``block``: at least one, if any batch is held)."""
        waiting = {self._recvs[i]: i for i, held in enumerate(self._held) if held}
        if not waiting:
            return []
        done: list[tuple[object, Outcome]] = []
        for conn in wait_for(list(waiting), timeout=None if block else 0):
            worker = waiting[conn]  # type: ignore[index]
            tag = self._held[worker][0]
            try:
                answer = conn.recv()  # type: ignore[union-attr]
            except (EOFError, OSError):
                raise self._died(worker, tag) from None
            self._held[worker].popleft()
            if isinstance(answer, _Failed):
                raise answer.error from RemoteTraceback(answer.trace)
            done.append((tag, answer))
        return done

    def drain(self) -> list[tuple[object, Outcome]]:
        """Every outcome still to come."""
        done: list[tuple[object, Outcome]] = []
        while self.busy:
            done += self.collect(block=True)
        return done

    def _died(self, worker: int, tag: object) -> WorkerDied:
        proc = self._procs[worker]
        try:
            code: int | str | None = proc.wait(EXIT_WAIT)
        except subprocess.TimeoutExpired:
            code = "none yet"
        first = tag[0].key if isinstance(tag, list) and tag else "?"
        return WorkerDied(
            f"a validate worker process ended (exit code {code}) while checking a batch of "
            f"chunks from {first!r}: they were not checked"
        )

    def close(self, *, wait: bool = True) -> None:
        """Stop every worker: asked to exit (``wait``: given :data:`EXIT_WAIT` to finish
        the batch it is on), then killed if it has not."""
        for conn in self._sends:
            if wait:
                try:
                    conn.send(None)
                except (OSError, ValueError):
                    pass
            conn.close()
        for conn in self._recvs:
            conn.close()
        for proc in self._procs:
            try:
                proc.wait(EXIT_WAIT if wait else 0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._sends, self._recvs, self._procs = [], [], []
