"""Run `sqa serve` as a child process on a free loopback port, wait until it is ready, stop it.

Used by the demo, the answer-latency benchmark and the real-server integration tests.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


class ServerNotReady(RuntimeError):
    pass


@dataclass(frozen=True)
class RunningServer:
    base: str  # "http://127.0.0.1:PORT"
    process: subprocess.Popen
    ready: dict  # the /readyz body
    startup_s: float
    log_path: Path

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 30) -> str:
    with open(path, errors="replace") as fh:
        return "".join(deque(fh, maxlen=lines))


@contextlib.contextmanager
def served(
    env: Mapping[str, str],
    log_path: Path,
    *,
    ready_timeout_s: float = 300.0,
    log_level: str = "warning",
    port: int | None = None,
) -> Iterator[RunningServer]:
    """Start the server with `env` (on `port`, else a free one), yield once /readyz answers 200,
    always stop it afterwards.

    Raises ServerNotReady (with the log's tail) if it exits or is not ready in time.
    """
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                log_level,
            ],
            cwd=ROOT,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + ready_timeout_s
        last = "no answer yet"
        while True:
            if proc.poll() is not None:
                raise ServerNotReady(f"the server exited with code {proc.returncode}:\n{log_tail(log_path)}")
            try:
                r = httpx.get(f"{base}/readyz", timeout=5)
                if r.status_code == 200:
                    break
                last = r.text[:200]
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise ServerNotReady(f"not ready within {ready_timeout_s:.0f} s (last: {last}):\n{log_tail(log_path)}")
            time.sleep(0.5)
        yield RunningServer(base, proc, r.json(), time.perf_counter() - t0, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
