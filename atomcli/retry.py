"""Bounded retries and rate limiting for tools and judges.

`ToolFault` marks a *transient* failure (timeout, connection error, HTTP 429/5xx, a rate
limit from a search engine): `RetryPolicy.call` retries it with exponential backoff and
jitter, honouring a server's Retry-After up to a cap. Anything else is permanent and goes
straight through; the caller turns it into an error observation. `RateLimiter` is a
thread-safe token bucket; `limiter(name, rate)` hands out one per backend per process, so
every ToolBox in a process shares the same budget toward one service.
"""

from __future__ import annotations

import email.utils
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

T = TypeVar("T")


class ToolFault(Exception):
    """A transient failure worth retrying. `retry_after`: seconds the server asked us to wait."""

    def __init__(self, message: str, *, retry_after: float | None = None, status: int | None = None):
        super().__init__(message)
        self.retry_after, self.status = retry_after, status


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None when absent or bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass
class RetryPolicy:
    """`attempts` tries in all; delay before retry n (1-based) is base*2**(n-1), capped, with jitter.

    Jitter is "equal jitter": half the delay is fixed, half uniform, so that many workers that
    failed together do not retry together. A Retry-After longer than `max_retry_after` is cut
    to it: a server asking for an hour would stall the whole rollout.
    """
    attempts: int = 3
    base: float = 0.5
    cap: float = 8.0
    max_retry_after: float = 30.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def delay(self, retry: int, fault: ToolFault | None = None) -> float:
        d = min(self.cap, self.base * (2 ** (retry - 1)))
        d = d / 2 + self.rng.uniform(0, d / 2)
        if fault is not None and fault.retry_after is not None:
            d = max(d, min(fault.retry_after, self.max_retry_after))
        return d

    def call(self, fn: Callable[..., T], *args, on_retry: Callable[[int, ToolFault], None] | None = None,
             **kwargs) -> T:
        """fn(*args, **kwargs), retrying ToolFault; the last ToolFault is re-raised."""
        return self.call_by(None, fn, *args, on_retry=on_retry, **kwargs)

    def call_by(self, deadline: float | None, fn: Callable[..., T], *args,
                on_retry: Callable[[int, ToolFault], None] | None = None, **kwargs) -> T:
        """`call`, but no retry starts, and no backoff sleeps, past `deadline` (time.monotonic()):
        the last ToolFault is re-raised instead, so retries never stretch a caller's deadline."""
        for attempt in range(1, max(1, self.attempts) + 1):
            try:
                return fn(*args, **kwargs)
            except ToolFault as fault:
                if attempt >= self.attempts:
                    raise
                wait = self.delay(attempt, fault)
                if deadline is not None and time.monotonic() + wait >= deadline:
                    raise
                if on_retry is not None:
                    on_retry(attempt, fault)
                self.sleep(wait)
        raise AssertionError("unreachable")


class RateLimiter:
    """Token bucket: `rate` calls per second on average, bursts of up to `burst`. Thread-safe."""

    def __init__(self, rate: float, burst: int = 1, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        if rate <= 0:
            raise ValueError("rate must be > 0 calls/s")
        self.rate, self.burst = float(rate), max(1, int(burst))
        self._clock, self._sleep = clock, sleep
        self._tokens, self._stamp = float(self.burst), clock()
        self._lock = threading.Lock()

    def acquire(self) -> float:
        """Take one token, waiting for it if needed; returns the seconds waited."""
        waited = 0.0
        while True:
            with self._lock:
                now = self._clock()
                self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
                self._stamp = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return waited
                need = (1 - self._tokens) / self.rate
            # sleep outside the lock so other threads can refill and check too
            self._sleep(need)
            waited += need


_LIMITERS: dict[tuple[str, float, int], RateLimiter] = {}
_LIMITERS_LOCK = threading.Lock()


def limiter(name: str, rate: float | None, burst: int = 1) -> RateLimiter | None:
    """The process-wide limiter for backend `name` at `rate` calls/s (None or <= 0: unlimited)."""
    if not rate or rate <= 0:
        return None
    key = (name, float(rate), int(burst))
    with _LIMITERS_LOCK:
        if key not in _LIMITERS:
            _LIMITERS[key] = RateLimiter(rate, burst)
        return _LIMITERS[key]
