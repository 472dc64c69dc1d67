"""Local chunks read and judged in worker processes: ``n5fs validate`` on a local disk.

Why processes: a small chunk on a local disk costs three system calls and a check of a few
microseconds, while the thread that lists and classifies holds the GIL most of the time. With
worker threads, each return from a system call waits for the GIL, so on two cores two worker
threads did less than one; in processes, the workers read and judge holding no lock anyone
else wants, while the parent lists, classifies and counts.

What goes over the pipes: the parent sends a batch, a list of :class:`Group` (the names of
chunks of one folder, their grid positions, the folder's local path as the store resolved it,
and a token for the array that judges them), plus each array (pickled once by the parent) not
sent to that worker before; the worker answers each batch, in order, with one
:class:`Outcome`: counts, the findings (keys in full), and the indexes of the chunks it could
not open or read, which the parent asks of the store's ``get`` (a link, a file gone: ``get``
decides, as for every read). A check that fails with anything but a finding (a bug) is sent
back and raised by the parent, where it ends the run as it would in a thread.

Start: a fresh interpreter running :func:`main`, with the parent's ``sys.path``, in a session
of its own (a Ctrl-C at the terminal reaches the parent only, which decides), talking over two
pipes whose descriptors it is given. Never a ``fork`` of the parent, whose other threads may
hold locks; and not :mod:`multiprocessing`'s ``spawn`` or ``forkserver`` either, which import
the parent's ``__main__`` again in the worker (a script or a command line tool without a
``__main__`` guard would run once more in each). Starting takes about a second (imports): a
worker says :data:`READY` once it can work, and until every worker has, the parent's caller
goes on with threads (:meth:`Workers.ready`); a worker that ends before it is ready means
there are no workers, not a failed run.

Failure: a worker that ends while it holds batches (killed, crashed in a decoder) ends the run
with :class:`WorkerDied`, naming the chunks it held: they were not checked, and nothing is
called valid. Workers exit when their pipe closes, so none outlives its parent by more than
the batch it is on; the parent closes them when the run ends, either way (:meth:`close`).

Lock discipline: a :class:`Workers` is used by one thread (the listing's); no locks.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import traceback
from collections import deque
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for
from typing import TYPE_CHECKING, Generic, NamedTuple, Protocol, TypeVar, cast

from n5fs.errors import N5fsError
from n5fs.validate.check import DIR_FLAGS, GUESS, judge, read_file

if TYPE_CHECKING:
    from collections.abc import Sequence

    from n5fs.formats.base import ArrayNode
    from n5fs.validate.report import Finding

__all__ = [
    "DEPTH",
    "READY",
    "Group",
    "Outcome",
    "WorkerDied",
    "Workers",
    "check_batch",
    "main",
]

#: batches sent to one worker and not answered yet: one to work on, one waiting in its pipe
DEPTH = 2
#: seconds a closing parent waits for each worker to exit before it is killed
EXIT_WAIT = 5.0
#: a worker's first message: it has imported what it needs and waits for batches
READY = "ready"
#: what a worker interpreter runs: interrupts ignored first (the parent decides what one
#: ends), the parent's ``sys.path``, then :func:`main`
_BOOT = (
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "import sys; sys.path[:] = sys.argv[3:]; "
    "from n5fs.validate.procs import main; main(int(sys.argv[1]), int(sys.argv[2]))"
)


class Keyed(Protocol):
    """What a batch is made of, as far as :class:`Workers` cares: things with a key."""

    @property
    def key(self) -> str: ...


#: the parent's own record of a chunk sent (given back with its batch's outcome)
Job = TypeVar("Job", bound=Keyed)


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
    """One batch done: ``judged`` chunks found valid, invalid or unreadable (``nbytes`` read),
    and the indexes (over the batch's groups in order) of the ones left to the store's ``get``."""

    judged: int
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


def check_batch(groups: Sequence[Group], arrays: dict[int, ArrayNode]) -> Outcome:
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
    the pipe closes (the parent is done, or gone)."""
    from n5fs.malloc import reuse_large_buffers

    reuse_large_buffers()  # a batch job, as the parent (n5fs.malloc)
    import n5fs.formats.registry  # noqa: F401  (every format: what the arrays sent need)

    serve(Connection(inbox, writable=False), Connection(outbox, readable=False))


def serve(inbox: Connection, outbox: Connection) -> None:
    arrays: dict[int, ArrayNode] = {}
    try:
        outbox.send(READY)
    except OSError:
        return
    while True:
        try:
            groups, new = inbox.recv()
        except (EOFError, OSError):
            return
        answer: Outcome | _Failed
        try:
            arrays.update((token, pickle.loads(blob)) for token, blob in new.items())
            answer = check_batch(groups, arrays)
        except Exception as exc:  # noqa: BLE001 (a bug: the parent raises it, ending the run)
            answer = _Failed(exc, traceback.format_exc())
        try:
            outbox.send(answer)
        except OSError:
            return
        except Exception as exc:  # noqa: BLE001 (the error would not pickle: its text instead)
            outbox.send(_Failed(RuntimeError(repr(answer)), str(exc)))


class Workers(Generic[Job]):
    """``count`` worker processes; batches go to the least busy one. From one thread.

    Each batch is submitted with the parent's list of its chunks (in the order of its groups'
    names), and its outcome comes back with that list, from :meth:`submit`, :meth:`collect`
    or :meth:`drain`: :attr:`Outcome.retry` indexes it."""

    def __init__(self, count: int) -> None:
        self._sends: list[Connection] = []
        self._recvs: list[Connection] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        #: workers that said READY
        self._ready: list[bool] = []
        #: the batches each worker holds, oldest first
        self._held: list[deque[list[Job]]] = []
        #: the array tokens each worker has
        self._known: list[set[int]] = []
        try:
            for _ in range(max(1, count)):
                self._spawn()
        except BaseException:
            self.close(wait=False)
            raise

    def _spawn(self) -> None:
        if not sys.executable:
            raise OSError("no Python interpreter to start workers with")
        theirs_in, ours_out = os.pipe()
        ours_in, theirs_out = os.pipe()
        try:
            argv = [sys.executable, "-c", _BOOT, str(theirs_in), str(theirs_out), *sys.path]
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs_in, theirs_out),
                close_fds=True,
                start_new_session=True,
            )
        except BaseException:
            os.close(ours_out)
            os.close(ours_in)
            raise
        finally:
            os.close(theirs_in)
            os.close(theirs_out)
        self._sends.append(Connection(ours_out, readable=False))
        self._recvs.append(Connection(ours_in, writable=False))
        self._procs.append(proc)
        self._ready.append(False)
        self._held.append(deque())
        self._known.append(set())

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def ready(self, *, block: bool = False) -> bool:
        """Has every worker said :data:`READY` (``block``: wait until each has)? Raises
        ``OSError`` if one ended first: there are no workers (close them)."""
        for worker, conn in enumerate(self._recvs):
            if self._ready[worker]:
                continue
            if not block and not conn.poll():
                return False
            try:
                said = conn.recv()
            except (EOFError, OSError):
                said = None
            if said != READY:
                code = self._procs[worker].poll()
                raise OSError(f"a validate worker process did not start (exit code {code})")
            self._ready[worker] = True
        return True

    def submit(
        self, jobs: list[Job], groups: list[Group], arrays: dict[int, bytes]
    ) -> list[tuple[list[Job], Outcome]]:
        """Send a batch (and the pickled arrays its groups name, from ``arrays``, that the
        worker lacks) to the least busy worker, first waiting while every worker holds
        :data:`DEPTH`; return the outcomes that came in meanwhile."""
        done = self.collect(block=False)
        while min(len(held) for held in self._held) >= DEPTH:
            done += self.collect(block=True)
        worker = min(range(len(self._held)), key=lambda i: len(self._held[i]))
        known = self._known[worker]
        new = {g.token: arrays[g.token] for g in groups if g.token not in known}
        self._held[worker].append(jobs)
        try:
            self._sends[worker].send((groups, new))
        except OSError:  # its end of the pipe is closed: it is gone
            raise self._died(worker) from None
        known.update(new)
        return done

    def collect(self, *, block: bool) -> list[tuple[list[Job], Outcome]]:
        """The outcomes in now (``block``: at least one, if any batch is held)."""
        waiting = {self._recvs[i]: i for i, held in enumerate(self._held) if held}
        if not waiting:
            return []
        done: list[tuple[list[Job], Outcome]] = []
        for ready in wait_for(list(waiting), timeout=None if block else 0):
            conn = cast("Connection", ready)
            worker = waiting[conn]
            try:
                answer: Outcome | _Failed = conn.recv()
            except (EOFError, OSError):
                raise self._died(worker) from None
            jobs = self._held[worker].popleft()
            if isinstance(answer, _Failed):
                raise answer.error from RemoteTraceback(answer.trace)
            done.append((jobs, answer))
        return done

    def drain(self) -> list[tuple[list[Job], Outcome]]:
        """Every outcome still to come."""
        done: list[tuple[list[Job], Outcome]] = []
        while any(self._held):
            done += self.collect(block=True)
        return done

    def _died(self, worker: int) -> WorkerDied:
        proc = self._procs[worker]
        try:
            code: int | str = proc.wait(EXIT_WAIT)
        except subprocess.TimeoutExpired:
            code = "none yet"
        keys = sorted(job.key for batch in self._held[worker] for job in batch)
        held = f"{len(keys)} chunks ({keys[0]} .. {keys[-1]})" if keys else "no chunks"
        return WorkerDied(
            f"a validate worker process ended (exit code {code}) while it held {held}: they "
            "were not checked, and the run stopped there (not every chunk was checked)"
        )

    def close(self, *, wait: bool = True) -> None:
        """Stop every worker: its pipe closed (it exits once done with the batch it is on;
        ``wait``: given :data:`EXIT_WAIT` for that), then killed if it has not exited; one not
        ready yet (it holds nothing, and would notice the closed pipe only once its imports
        are done) at once."""
        for conn in (*self._sends, *self._recvs):
            conn.close()
        for proc, ready in zip(self._procs, self._ready, strict=True):
            _stop(proc, EXIT_WAIT if wait and ready else 0)  # one still starting holds nothing
        self._sends, self._recvs, self._procs = [], [], []


def _stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """``proc`` gone: given ``grace`` seconds to exit, then killed."""
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
