"""HTTP for the feed poller (workers/feed_poller.py): polite, bounded GETs.

A feed host is somebody else's server, polled forever: it must never see more than one request per
`host_delay_s` from us (article pages included), a slow or failing host must not stall the poller
for long, and a huge body must not fill our memory. So every GET here
- waits for its host's turn: the next request to a host starts `host_delay_s` after the previous
  one to it ended (ended, not started: the server then sees the gap whatever the latency); a
  redirected request counts for the host it was sent to and for the host that answered it;
- is retried `retries` times with exponential backoff on connection errors, timeouts and 5xx, and
  never on 4xx (the URL is wrong: asking again will not help);
- reads the body as it comes and gives up past `max_bytes` (decoded size: a gzip bomb counts whole)
  or once the whole response has taken `TOTAL_TIMEOUTS` times `timeout_s` (a host trickling bytes).
Failures come back as one `FetchError` saying what went wrong, with the last HTTP status if any.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

TOTAL_TIMEOUTS = 3  # a whole response may take this many timeout_s (each read has timeout_s)


class FetchError(Exception):
    """A GET that failed for good; `status` is the last HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class _TooLarge(Exception):
    pass


@dataclass(frozen=True)
class Fetched:
    status: int  # 200 (or another 2xx) or 304
    body: bytes
    headers: httpx.Headers
    url: str  # after redirects


class PoliteFetcher:
    """GETs with per-host turns, retries and a size cap (see the module docstring).

    `sleep` and `clock` are time.sleep and time.monotonic; not thread-safe (one poller, one fetcher).
    """

    def __init__(
        self,
        client: httpx.Client,
        *,
        host_delay_s: float,
        timeout_s: float,
        retries: int,
        max_bytes: int,
        backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        if retries < 0 or max_bytes < 1 or timeout_s <= 0 or host_delay_s < 0:
            raise ValueError(
                f"bad fetch limits: retries={retries}, max_bytes={max_bytes}, timeout_s={timeout_s}, "
                f"host_delay_s={host_delay_s}"
            )
        self._client, self._delay, self._timeout = client, host_delay_s, timeout_s
        self._retries, self._max_bytes, self._backoff = retries, max_bytes, backoff_s
        self._sleep, self._clock = sleep, clock
        self._last: dict[str, float] = {}  # host -> when our last request to it ended

    def _wait_turn(self, host: str) -> None:
        last = self._last.get(host)
        if last is not None:
            wait = last + self._delay - self._clock()
            if wait > 0:
                self._sleep(wait)

    def _once(self, url: str, headers: Mapping[str, str]) -> Fetched:
        deadline = self._clock() + TOTAL_TIMEOUTS * self._timeout
        with self._client.stream("GET", url, headers=dict(headers), timeout=self._timeout) as r:
            length = r.headers.get("content-length", "")
            if length.isdigit() and int(length) > self._max_bytes:
                raise _TooLarge()
            body = bytearray()
            if r.status_code != 304:
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) > self._max_bytes:
                        raise _TooLarge()
                    if self._clock() > deadline:
                        raise httpx.ReadTimeout(f"the response took over {TOTAL_TIMEOUTS * self._timeout:g} s")
            return Fetched(r.status_code, bytes(body), r.headers, str(r.url))

    def get(self, url: str, headers: Mapping[str, str] | None = None) -> Fetched:
        """GET `url` (2xx or 304), or raise FetchError once the retries are spent."""
        host = (urlsplit(url).hostname or "").lower()
        tries = self._retries + 1
        problem, status = "", None
        for attempt in range(tries):
            if attempt:
                self._sleep(self._backoff * 2 ** (attempt - 1))
            self._wait_turn(host)
            try:
                got = self._once(url, headers or {})
            except _TooLarge:
                raise FetchError(
                    f"GET {url}: the body is larger than {self._max_bytes:,} bytes, the most a feed or "
                    "page may hold (SQA_FEED_MAX_BYTES); raise it or drop the feed",
                    200,
                ) from None
            except httpx.TimeoutException as exc:
                problem, status = f"timed out after {self._timeout:g} s ({type(exc).__name__})", None
                continue
            except httpx.HTTPError as exc:  # refused, reset, bad redirect, not HTTP
                problem, status = f"failed: {type(exc).__name__}: {exc}", None
                continue
            finally:
                self._last[host] = self._clock()
            final = (urlsplit(got.url).hostname or "").lower()
            if final != host:  # redirected: the host that answered waits its turn too
                self._last[final] = self._last[host]
            status = got.status
            if got.status == 304 or 200 <= got.status < 300:
                return got
            if got.status >= 500:
                problem = f"answered HTTP {got.status}"
                continue
            raise FetchError(
                f"GET {url} answered HTTP {got.status}: check the URL (the feed may have moved or be private)",
                got.status,
            )
        raise FetchError(
            f"GET {url} {problem} ({tries} attempt(s)); it is tried again later, less often while it keeps failing",
            status,
        )
