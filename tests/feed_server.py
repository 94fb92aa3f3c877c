"""A tiny HTTP server on 127.0.0.1 for the feed tests (tests/workers/test_feeds.py, the CLI and API
tests): routes answer from the fixture files under tests/fixtures/feeds ("{base}" in them becomes the
server's address), and every request is recorded with its headers and arrival time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

FEEDS = Path(__file__).resolve().parent / "fixtures" / "feeds"
Answer = tuple[int, dict[str, str], bytes]  # status, headers, body


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    at: float  # time.monotonic() on arrival
    user_agent: str = field(default="")


class FeedServer:
    def __init__(self) -> None:
        self.routes: dict[str, Callable[[Seen], Answer]] = {}
        self.requests: list[Seen] = []
        self.release = threading.Event()  # slow routes wait on it (set when the server closes)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                seen = Seen(
                    path,
                    {k.lower(): v for k, v in self.headers.items()},
                    time.monotonic(),
                    self.headers.get("User-Agent", ""),
                )
                owner.requests.append(seen)
                route = owner.routes.get(path)
                status, headers, body = route(seen) if route else (404, {"Content-Type": "text/plain"}, b"not here")
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if status != 304:
                        self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                    pass

            def log_message(self, *args):  # quiet
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        return self.base + path

    def fixture(self, name: str) -> bytes:
        return (FEEDS / name).read_text(encoding="utf-8").replace("{base}", self.base).encode("utf-8")

    def serve(
        self,
        path: str,
        body: bytes | str,
        content_type: str = "application/rss+xml; charset=utf-8",
        *,
        etag: str | None = None,
        last_modified: str | None = None,
        status: int = 200,
    ) -> None:
        """Answer `path` with `body` (a fixture name or bytes); with `etag`, a matching If-None-Match gets a 304."""
        data = self.fixture(body) if isinstance(body, str) else body

        def answer(seen: Seen) -> Answer:
            headers = {"Content-Type": content_type}
            if etag:
                headers["ETag"] = etag
            if last_modified:
                headers["Last-Modified"] = last_modified
            if etag and seen.headers.get("if-none-match") == etag:
                return 304, headers, b""
            return status, headers, data

        self.routes[path] = answer

    def serve_slowly(self, path: str, wait_s: float = 5.0) -> None:
        """`path` answers only after `wait_s` (or when the server closes): a host that times out."""

        def answer(seen: Seen) -> Answer:
            self.release.wait(wait_s)
            return 200, {"Content-Type": "application/rss+xml"}, self.fixture("rss_content.xml")

        self.routes[path] = answer

    def seen(self, path: str) -> list[Seen]:
        return [r for r in self.requests if r.path == path]

    def close(self) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def feed_server():
    server = FeedServer()
    try:
        yield server
    finally:
        server.close()
