"""Warm processes to kill: a server process imports the CLI, the workers and spaCy once, then forks
one child per run (an `sqa` command line, or a script) for the kill tests to SIGKILL at random
points. A forked child is a separate process with its own database connections, files and exit
status, as `python -m app.cli ...` is, without the seconds each fresh interpreter spends importing
(the runs are what is tested, not the start-up).

The server uses no thread pool and opens no database before it forks (a child inherits neither).

    def test_x(fork_server):  # the module-scoped fixture below, imported into the test module
        run = fork_server.start(env, argv=["ingest", "--month", "2024-03", "--no-train"])
        run.kill()
        code, output = run.wait()   # code -9: killed
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class ForkedRun:
    """One forked child: its pid, its output file and, once it ended, its exit code (-N: signal N)."""

    def __init__(self, server: ForkServer, pid: int, log: Path) -> None:
        self.server, self.pid, self.log = server, pid, log
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server._read_exit(self, timeout=0)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:  # it has ended; the server reports how
                pass

    def wait(self, timeout: float = 300) -> tuple[int, str]:
        """(exit code, output) once the child has ended; fails after `timeout` s (the child is killed)."""
        if self.returncode is None:
            self.server._read_exit(self, timeout=timeout)
        if self.returncode is None:
            self.kill()
            self.server._read_exit(self, timeout=30)
            raise AssertionError(f"run {self.pid} did not end in {timeout}s: {self.output()}")
        return self.returncode, self.output()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for_line(self, line: str, timeout: float = 120) -> None:
        """Block until the child has printed `line` (fails if it ends or `timeout` s pass first)."""
        deadline = time.monotonic() + timeout
        while line not in self.output().splitlines():
            assert self.poll() is None, f"run {self.pid} ended before printing {line!r}: {self.output()}"
            assert time.monotonic() < deadline, f"run {self.pid} never printed {line!r}"
            time.sleep(0.005)


class ForkServer:
    """The warm server process (a context manager); `start` forks a run, one at a time."""

    def __init__(self) -> None:
        self._logs = Path(tempfile.mkdtemp(prefix="sqa-forked-"))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forked"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._runs = 0
        assert self._readline(timeout=300) == {"ready": True}, "the fork server did not start"

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, env: dict, *, argv: list[str] | None = None, code: str | None = None) -> ForkedRun:
        """Fork a child that runs `sqa ARGV...` (as `python -m app.cli`) or the script `code`, with `env`
        as its whole environment; returns at once."""
        assert (argv is None) != (code is None), "give argv or code"
        self._runs += 1
        log = self._logs / f"run-{self._runs}.log"
        self._proc.stdin.write(json.dumps({"env": env, "argv": argv, "code": code, "log": str(log)}) + "\n")
        self._proc.stdin.flush()
        reply = self._readline(timeout=60)
        return ForkedRun(self, reply["pid"], log)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc.stdout.close()

    def _readline(self, timeout: float) -> dict | None:
        if not select.select([self._proc.stdout], [], [], timeout)[0]:
            return None
        line = self._proc.stdout.readline()
        assert line, f"the fork server died (exit {self._proc.wait()})"
        return json.loads(line)

    def _read_exit(self, run: ForkedRun, timeout: float) -> None:
        reply = self._readline(timeout)
        if reply is not None:
            assert reply["pid"] == run.pid, reply
            run.returncode = reply["exit"]


@pytest.fixture(scope="module")
def fork_server():
    """One warm fork server for a test module (import it into the module that uses it)."""
    with ForkServer() as server:
        yield server


# ---- the server (python -m tests.forked) -------------------------------------------------------------


def _warm() -> None:
    """Import what the runs use, and load spaCy's sentencizer: no threads, no connections."""

    import app.bootstrap.builders  # noqa: F401, PLC0415 (lazy: the server's imports are its warm-up)
    import app.cli  # noqa: F401, PLC0415 (lazy: the server's imports are its warm-up)
    import workers.after_ingest  # noqa: F401, PLC0415 (lazy: the server's imports are its warm-up)
    import workers.ingest  # noqa: F401, PLC0415 (lazy: the server's imports are its warm-up)
    import workers.live_publisher  # noqa: F401, PLC0415 (lazy: the server's imports are its warm-up)
    from indexer.chunking import chunk_texts  # noqa: PLC0415 (lazy: the server's imports are its warm-up)

    chunk_texts(["Warm up. The sentencizer loads once."])


def _child(request: dict) -> None:
    """In the forked child: the request's environment and output file, then its command; never returns."""
    from app.cli import cli  # noqa: PLC0415 (lazy: imported by the server's warm-up)
    from settings import get_settings  # noqa: PLC0415 (lazy: imported by the server's warm-up)

    code = 1
    try:
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        get_settings.cache_clear()
        if request["argv"] is not None:
            cli(request["argv"], prog_name="sqa")  # click's standalone mode: always ends in SystemExit
        else:
            exec(compile(request["code"], "<forked>", "exec"), {"__name__": "__main__"})  # noqa: S102
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the output, as a crashed process would
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    _warm()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"pid": pid, "exit": os.waitstatus_to_exitcode(status)}), flush=True)
    os._exit(0)  # nothing to clean up: skip the interpreter's teardown of everything it imported


if __name__ == "__main__":
    serve()
