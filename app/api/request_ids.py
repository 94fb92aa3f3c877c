"""A request id for every HTTP request, in its response, its error body and every log line it causes;
and the logs as one JSON object a line (SQA_LOG_FORMAT=json) for a log shipper to parse.

- `RequestIds` (pure ASGI, outermost): takes the caller's `X-Request-ID` when it is a sane token
  (letters, digits, `._:-`, at most 64), else makes one; sends it back as `X-Request-ID`; writes one
  access line per request (`app.access`: method, path, status, duration, client).
- `current_request_id()`: the id of the request being served (a context variable: background
  threads started by a request do not carry it, and their log lines say "-").
- `configure_logging(level, fmt)`: the root logger's handler, text or JSON, with the id on each line.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import time
import uuid
from contextvars import ContextVar

REQUEST_ID: ContextVar[str | None] = ContextVar("sqa_request_id", default=None)
_SANE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
QUIET_PATHS = ("/healthz", "/readyz", "/metrics")  # probes: access lines at DEBUG only
access_log = logging.getLogger("app.access")


def current_request_id() -> str | None:
    return REQUEST_ID.get()


class RequestIds:
    """ASGI middleware: the request id, the X-Request-ID response header and the access line."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _SANE.fullmatch(given) else uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)
        status, t0 = 500, time.perf_counter()
        # When the request came in (request.state.arrived): the answer gate counts its time from here.
        scope.setdefault("state", {})["arrived"] = time.monotonic()

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            client = scope.get("client")
            path = scope.get("path", "")
            access_log.log(
                logging.DEBUG if path in QUIET_PATHS else logging.INFO,
                "%s %s %d",
                scope.get("method", ""),
                path,
                status,
                extra={
                    "method": scope.get("method", ""),
                    "path": path,
                    "status": status,
                    "duration_ms": round((time.perf_counter() - t0) * 1000, 1),
                    "client": client[0] if client else None,
                },
            )
            REQUEST_ID.reset(token)


def arrived_at(request) -> float | None:
    """When `request` came in (time.monotonic(), set by RequestIds; None outside it): the answer
    gate counts a request's whole time from there (AdmissionGate.admit's `since`)."""
    return getattr(request.state, "arrived", None)


class RequestIdFilter(logging.Filter):
    """Puts the current request id on every record (`-` outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get() or "-"
        return True


_EXTRAS = ("method", "path", "status", "duration_ms", "client", "job_id")


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC), level, logger, message, request_id, the access fields."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or REQUEST_ID.get() or "-",
        }
        out.update({k: getattr(record, k) for k in _EXTRAS if hasattr(record, k)})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """The root logger: one stderr handler, text or JSON, request ids on every line (replaces any)."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format {fmt!r} is not 'text' or 'json'")
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):  # uvicorn's own lines through the same handler
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
