"""The one retry policy of an S3 store's requests: which faults are retried, how long to wait,
when to stop, when the endpoint counts as silent, and how throttling slows the store down.

Why one policy of our own instead of botocore's retry modes: botocore's standard mode treats a
reset like a timeout, allows the same few attempts for both, and knows nothing of the call's
time bound; its adaptive mode's rate limiter can queue a request for minutes. Real endpoints
reset connections, answer ``500``/``503`` and stall far more often than loopback servers, and
each fault has its own cost: a reset or a ``5xx`` answers in one round trip, so many attempts
are cheap; a timeout costs its whole timeout, so few fit a POSIX call's bound. So (attached to
the client's events, which every request passes through: the store's own calls, paginated
LISTs and boto3's managed transfers alike):

- **Retried, up to :data:`MAX_ATTEMPTS`**: a reset, a refused or closed connection, a broken
  answer (:class:`~botocore.exceptions.HTTPClientError`), ``500``/``502``/``503``/``504``, the
  throttling and transient error codes of :data:`TRANSIENT_CODES`, and a body the server says
  arrived damaged (``BadDigest``, ``XAmzContentSHA256Mismatch``, ``IncompleteBody``).
- **Timeouts** (connect, read) are retried too, but only while the request has made fewer
  than the spec's ``max_attempts`` timed-out attempts: each costs ``connect_timeout +
  read_timeout``, and the defaults keep a silent endpoint's call near 12 s.
- **Backoff**: full jitter, ``uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2**n))`` before the
  n-th retry (throttling starts from a larger base), so retries of many threads spread out.
- **Bound**: no retry starts once :data:`DEADLINE` seconds have passed since the request's
  first attempt, whatever the counts say; a POSIX call answers in bounded time.

:class:`SilentEndpoint` fails requests at once while the endpoint is known not to answer: only
a timeout makes it so (a reset or a ``5xx`` is an answer), and the first answered request
clears it, so one key that stalls costs the other calls little. :class:`Throttle` is a token
bucket shared by every request of the store: each throttling answer (``SlowDown``, ``429``)
lowers its rate, calm time raises it back until it no longer limits.

Everything else (4xx answers such as ``NoSuchKey``, ``AccessDenied``, ``PreconditionFailed``)
is an answer, never retried here.

State and locks: :class:`RetryPolicy` keeps per-request counters in the request's botocore
context (one request, one thread: no lock); :class:`SilentEndpoint` keeps its state under its
own lock; :class:`Throttle` keeps its rate and tokens under its own lock and sleeps outside it;
:class:`Tally` (what all of them handled, for ``stats.json``) has its own lock. Each is a leaf
lock: none is held while another is taken, none across a request.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any

from botocore import exceptions as bce

from n5fs.errors import StoreUnavailable

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)

__all__ = [
    "DEADLINE",
    "MAX_ATTEMPTS",
    "RetryPolicy",
    "SilentEndpoint",
    "Tally",
    "Throttle",
    "attach",
]

#: attempts of one request that meets resets, refusals or transient answers
MAX_ATTEMPTS = 10
#: no retry starts this many seconds after a request's first attempt
DEADLINE = 20.0
#: the backoff's first ceiling and its cap, in seconds
BACKOFF_BASE = 0.05
BACKOFF_CAP = 2.0
#: throttling answers back off from this ceiling instead
THROTTLE_BASE = 0.25
#: error codes that say "try again" (throttling first)
THROTTLE_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"}
)
TRANSIENT_CODES = THROTTLE_CODES | frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "BadDigest",
        "XAmzContentSHA256Mismatch",
        "IncompleteBody",
        "OperationAborted",
    }
)
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
#: timeouts: the endpoint did not answer in time
TIMEOUTS = (bce.ConnectTimeoutError, bce.ReadTimeoutError)
#: faults of the connection or of an answer: the endpoint is there
BROKEN = (bce.ConnectionError, bce.HTTPClientError)

_CONTEXT = "n5fs_retry"


def _code_and_status(response: Any) -> tuple[str, int]:
    """The S3 error code and HTTP status of an answer botocore parsed."""
    if not response:
        return "", 0
    http, parsed = response
    code = str((parsed or {}).get("Error", {}).get("Code", "")) if isinstance(parsed, dict) else ""
    return code, int(getattr(http, "status_code", 0) or 0)


class Tally:
    """Named counts of the faults a store handled (``/.n5fs/stats.json``), added from any
    thread: a dict under its own lock, held for one addition."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + amount

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class RetryPolicy:
    """The ``needs-retry`` handler (module docstring): returns the seconds to sleep before the
    next attempt, or None to stop. ``timeout_attempts`` is the spec's ``max_attempts``."""

    def __init__(
        self,
        timeout_attempts: int,
        throttle: Throttle | None = None,
        *,
        tally: Tally | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        deadline: float = DEADLINE,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.timeout_attempts = timeout_attempts
        self.max_attempts = max_attempts
        self.deadline = deadline
        self.throttle = throttle
        self.tally = tally or Tally()
        self.clock = clock
        self._rng = rng or random.Random()

    def needs_retry(
        self,
        attempts: int,
        response: Any = None,
        caught_exception: BaseException | None = None,
        request_dict: dict[str, Any] | None = None,
        **_: Any,
    ) -> float | None:
        context = (request_dict or {}).get("context")
        state: dict[str, float] = {}
        if isinstance(context, dict):
            state = context.setdefault(_CONTEXT, {"start": self.clock(), "timeouts": 0})
        throttled = False
        if caught_exception is not None:
            if isinstance(caught_exception, TIMEOUTS):
                self.tally.add("s3_timeouts")
                state["timeouts"] = state.get("timeouts", 0) + 1
                if state["timeouts"] >= self.timeout_attempts:
                    return None
            elif not isinstance(caught_exception, BROKEN):
                return None
        else:
            code, status = _code_and_status(response)
            if code not in TRANSIENT_CODES and status not in TRANSIENT_STATUS:
                return None
            throttled = code in THROTTLE_CODES or status == 429
            if throttled:
                self.tally.add("s3_throttled")
                if self.throttle is not None:
                    self.throttle.throttled()
        if attempts >= self.max_attempts:
            return None
        if "start" in state and self.clock() - state["start"] >= self.deadline:
            return None
        ceiling = min(
            BACKOFF_CAP, (THROTTLE_BASE if throttled else BACKOFF_BASE) * 2 ** (attempts - 1)
        )
        delay = self._rng.uniform(0, ceiling)
        self.tally.add("s3_retries")
        what = type(caught_exception).__name__ if caught_exception else _code_and_status(response)
        log.debug("s3: attempt %d failed (%s); again in %.3f s", attempts, what, delay)
        return delay


class SilentEndpoint:
    """Fail fast while the endpoint is known not to answer.

    One request to a silent endpoint costs its whole timeout budget (connect, read, its
    timed-out retries: ~12 s by default), and one POSIX call may make several requests one
    after another (a lookup per path component). Once a request has timed out for good, the
    endpoint counts as silent: while it does, one request at a time is let through as a probe
    and every other request fails at once with StoreUnavailable (EIO) instead of waiting
    again. The first answer of any request (an error answer too) clears it; a probe that times
    out keeps it. So a call on a hung endpoint answers EIO within about one request's budget,
    however many requests it would have made; and one key that stalls (the endpoint answers
    everything else) costs other calls at most the probe's round trip. After ``cooldown``
    seconds with no answer, every request is let through again.

    State: ``_silent_until``, ``_since`` and ``_probing`` under ``_lock`` (held for a few
    assignments, never across a request).
    """

    def __init__(
        self,
        where: str,
        cooldown: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        tally: Tally | None = None,
    ) -> None:
        self.where = where
        self.tally = tally or Tally()
        self.cooldown = cooldown
        self.clock = clock
        self._lock = threading.Lock()
        self._silent_until = 0.0
        self._since = 0.0
        self._probing = False

    def attach(self, client: Any) -> SilentEndpoint:
        client.meta.events.register("before-call.s3", self._before_call)
        client.meta.events.register("after-call.s3", self._answered)
        client.meta.events.register("after-call-error.s3", self._after_error)
        return self

    # the same steps for a request that does not pass botocore's events
    # (:mod:`~n5fs.kvstore.s3.lean`): one ``context`` dict per request

    def before_call(self, context: dict[str, Any]) -> None:
        """Before a request's first attempt: raises StoreUnavailable while silent."""
        self._before_call(context=context)

    def answered(self, context: dict[str, Any]) -> None:
        """The request got an answer (an error answer too)."""
        self._answered(context=context)

    def failed(self, exception: BaseException, context: dict[str, Any]) -> None:
        """The request failed for good without an answer."""
        self._after_error(exception=exception, context=context)

    @property
    def silent(self) -> bool:
        return self.clock() < self._silent_until

    def _before_call(self, context: dict[str, Any] | None = None, **_: Any) -> None:
        with self._lock:
            now = self.clock()
            if now >= self._silent_until:
                self._probing = False  # a probe lost without an event cannot block the next
                return
            if not self._probing:
                self._probing = True
                if context is not None:
                    context["n5fs_probe"] = True
                return
            since, left = now - self._since, self._silent_until - now
        self.tally.add("s3_failed_fast")
        raise StoreUnavailable(
            f"s3 endpoint of {self.where} did not answer a request {since:.0f} s ago (timed "
            f"out after its retries); failing at once for {left:.0f} s more unless a request "
            "in flight gets an answer"
        )

    def _answered(self, context: dict[str, Any] | None = None, **_: Any) -> None:
        with self._lock:
            self._silent_until = 0.0
            if context is not None and context.pop("n5fs_probe", False):
                self._probing = False

    def _after_error(
        self,
        exception: BaseException | None = None,
        context: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        with self._lock:
            if context is not None and context.pop("n5fs_probe", False):
                self._probing = False
            if isinstance(exception, TIMEOUTS):
                now = self.clock()
                self._since = now
                self._silent_until = now + self.cooldown


class Throttle:
    """A token bucket shared by every request of one store: unlimited until the endpoint
    throttles, then at most ``rate`` requests a second.

    Each throttling answer cuts the rate to :data:`CUT` of the rate it allowed (of the rate
    measured over the last second, the first time), at most once per :data:`CUT_EVERY` s, never
    below ``floor``; each :data:`CUT_EVERY` s without one raises it by :data:`GROWTH`, and once
    it passes the rate measured before the first cut the bucket stops limiting. A request that
    finds no token sleeps until one is due (outside the lock); a wait is never longer than
    ``1 / floor`` seconds per request ahead of it.

    State: ``_rate`` (None: unlimited), ``_tokens``, ``_stamp``, ``_window``/``_sent`` (the
    send rate of the last second), ``_ceiling``, ``_last_cut`` under ``_lock``.
    """

    CUT = 0.7
    GROWTH = 1.25
    CUT_EVERY = 0.5

    def __init__(
        self,
        floor: float = 50.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.floor = floor
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.Lock()
        self._rate: float | None = None
        self._tokens = 0.0
        self._stamp = clock()
        self._window = self._stamp
        self._sent = 0
        self._last_rate = 0.0
        self._ceiling = 0.0
        self._last_cut = 0.0
        #: throttling answers seen, and seconds requests waited for a token (for stats)
        self.throttles = 0
        self.waited = 0.0

    def attach(self, client: Any) -> Throttle:
        client.meta.events.register("before-send.s3", self._before_send)
        return self

    @property
    def rate(self) -> float | None:
        return self._rate

    def _before_send(self, **_: Any) -> None:
        wait = self.acquire()
        if wait > 0:
            self.sleep(wait)

    def acquire(self) -> float:
        """Take a token; the seconds to wait before sending (0: send now)."""
        with self._lock:
            now = self.clock()
            if now - self._window >= 1.0:
                self._last_rate = self._sent / (now - self._window)
                self._window, self._sent = now, 0
            self._sent += 1
            rate = self._grown(now)
            if rate is None:
                return 0.0
            self._tokens = min(rate, self._tokens + (now - self._stamp) * rate)
            self._stamp = now
            self._tokens -= 1.0
            if self._tokens >= 0:
                return 0.0
            wait = -self._tokens / rate
            self.waited += wait
            return wait

    def _grown(self, now: float) -> float | None:
        """The rate after the calm time since the last cut (None: no longer limited)."""
        rate = self._rate
        while rate is not None and now - self._last_cut >= self.CUT_EVERY:
            self._last_cut += self.CUT_EVERY
            rate *= self.GROWTH
            if rate > self._ceiling:
                rate = None
                log.info("s3: no throttling for a while; request rate no longer limited")
        self._rate = rate
        return rate

    def throttled(self) -> None:
        """A throttling answer arrived: lower the rate (class docstring)."""
        with self._lock:
            self.throttles += 1
            now = self.clock()
            if self._rate is None:
                measured = max(self._last_rate, self._sent / max(now - self._window, 1e-3))
                self._ceiling = max(measured, self.floor)
                self._rate = self._ceiling
                self._tokens = 0.0
                self._stamp = now
            elif now - self._last_cut < self.CUT_EVERY:
                return
            self._rate = max(self.floor, self._rate * self.CUT)
            self._last_cut = now
            log.info("s3: the endpoint throttles; at most %.0f requests/s for now", self._rate)


def attach(
    client: Any, where: str, timeout_attempts: int, tally: Tally
) -> tuple[SilentEndpoint, Throttle, RetryPolicy]:
    """Put the policy on ``client``: its retries, its silent-endpoint breaker and its
    throttle (the client's own retries must be off: ``total_max_attempts`` 1), counting
    what they do in ``tally``. Returned too, for requests that do not pass the client's
    events (:mod:`~n5fs.kvstore.s3.lean`)."""
    throttle = Throttle().attach(client)
    policy = RetryPolicy(timeout_attempts, throttle, tally=tally)
    client.meta.events.register("needs-retry.s3", policy.needs_retry)
    return SilentEndpoint(where, tally=tally).attach(client), throttle, policy
