"""What keeps one client from hurting the others: a request body limit, per-client rate limits, a
brake on admin token guessing, and the Prometheus metrics that show it.

- `BodyLimit` (pure ASGI): a body longer than SQA_MAX_BODY_BYTES is refused with 413 before it is
  parsed: at once when Content-Length says so, else as soon as the streamed bytes pass the limit.
- Rate limits (`limits`, a moving window): SQA_RATE_LIMIT per client address
  on every path but the health checks and the metrics; over it, 429 with Retry-After. (slowapi does
  not see the routes of FastAPI's included routers in this version, hence the small middleware.)
- Admin token guessing: SQA_ADMIN_FAILURE_LIMIT wrong or missing tokens per client address, then
  429 for the rest of the window, even with the right token (`AdminGuard`).
- `/metrics` (prometheus-fastapi-instrumentator): request counts and latencies by route and status,
  and the operator's `sqa_` metrics in the same registry (app/api/operator_metrics.py).

The counts live in SQA_LIMITS_STORAGE (a `limits` storage URI): `memory://`, each process its own,
or `redis://host:6379` (with the `redis` package), shared by every API replica, so that a client
behind the proxy meets one limit however its requests are spread.
"""

from __future__ import annotations

import json
import math
import time

from fastapi import FastAPI
from limits import parse
from limits.errors import ConfigurationError
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter
from prometheus_client import CollectorRegistry
from prometheus_fastapi_instrumentator import Instrumentator

from app.api import operator_metrics
from app.api.request_ids import current_request_id

UNLIMITED_PATHS = ("/healthz", "/readyz", "/metrics")


class BodyLimit:
    """ASGI middleware: 413 for a request body over `max_bytes`."""

    def __init__(self, app, max_bytes: int, paths: dict[str, tuple[int, str]] | None = None) -> None:
        """`paths`: routes with a limit of their own, {path: (bytes, the setting that sets it)}
        (POST /admin/articles takes batches of news, SQA_MAX_ARTICLES_BODY_BYTES)."""
        self.app, self.max_bytes, self.paths = app, max_bytes, dict(paths or {})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        max_bytes, setting = self.paths.get(scope.get("path", ""), (self.max_bytes, "SQA_MAX_BODY_BYTES"))
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            return await self._refuse(send, int(length), max_bytes, setting)
        seen = 0
        started = refused = False

        async def limited_receive():
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes and not started:
                    # answer now, and tell the app the client left (it stops reading; what it
                    # sends after this is dropped)
                    refused = True
                    await self._refuse(send, None, max_bytes, setting)
                    return {"type": "http.disconnect"}
            return message

        async def watched_send(message):
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited_receive, watched_send)

    async def _refuse(self, send, length: int | None, max_bytes: int, setting: str) -> None:
        size = f"{length} bytes" if length is not None else f"over {max_bytes} bytes"
        body = json.dumps(
            {
                "detail": f"the request body is {size}; the limit is {max_bytes} bytes ({setting})",
                "request_id": current_request_id(),
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class AdminGuard:
    """Counts failed admin authentications per client address in a moving window (`limits`)."""

    def __init__(self, limit: str, storage=None) -> None:
        self.item = parse(limit)
        self.limiter = MovingWindowRateLimiter(storage if storage is not None else limits_storage())

    def blocked_for(self, address: str) -> float | None:
        """Seconds until this address may try again, or None when it may now."""
        if self.limiter.test(self.item, "admin-fail", address):
            return None
        reset, _ = self.limiter.get_window_stats(self.item, "admin-fail", address)
        return max(1.0, reset - time.time())

    def failed(self, address: str) -> None:
        self.limiter.hit(self.item, "admin-fail", address)


class RateLimit:
    """ASGI middleware: at most `limit` requests per client address in a moving window."""

    def __init__(self, app, limit: str, storage=None) -> None:
        self.app, self.text = app, limit
        self.item = parse(limit)
        self.limiter = MovingWindowRateLimiter(storage if storage is not None else limits_storage())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in UNLIMITED_PATHS:
            return await self.app(scope, receive, send)
        client = scope.get("client")
        address = client[0] if client else "unknown"
        if self.limiter.hit(self.item, "requests", address):
            return await self.app(scope, receive, send)
        reset, _ = self.limiter.get_window_stats(self.item, "requests", address)
        retry = max(1, math.ceil(reset - time.time()))
        body = json.dumps(
            {
                "detail": f"too many requests from this client: the limit is {self.text} "
                f"(SQA_RATE_LIMIT); try again in {retry} s",
                "request_id": current_request_id(),
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 429,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(retry).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def limits_storage(uri: str = "memory://"):
    """The `limits` storage a URI names (memory://, redis://...); ValueError says what is wrong."""
    try:
        return storage_from_string(uri)
    except (ConfigurationError, ValueError) as exc:  # an unknown scheme, or its client library missing
        raise ValueError(f"SQA_LIMITS_STORAGE={uri!r}: {exc}") from None


def install(
    app: FastAPI,
    *,
    max_body_bytes: int,
    rate_limit: str,
    admin_failure_limit: str,
    storage_uri: str = "memory://",
    body_paths: dict[str, tuple[int, str]] | None = None,
) -> None:
    """Add the body limit, the rate limit, the admin guard (app.state.admin_guard) and /metrics
    (its own registry per app, so that several apps in one process keep their counts apart; the
    operator's `sqa_` metrics in it too, app.state.answer_metrics); the limits count in
    `storage_uri` (shared by the replicas when it is Redis)."""
    storage = limits_storage(storage_uri)
    app.state.admin_guard = AdminGuard(admin_failure_limit, storage)
    registry = CollectorRegistry()
    operator_metrics.install(app, registry)
    Instrumentator(excluded_handlers=["/metrics"], registry=registry).instrument(app).expose(
        app, include_in_schema=False
    )
    if rate_limit:
        app.add_middleware(RateLimit, limit=rate_limit, storage=storage)
    app.add_middleware(
        BodyLimit, max_bytes=max_body_bytes, paths=body_paths
    )  # outermost: before anything reads the body
