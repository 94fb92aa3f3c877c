"""Scale-out under load and faults: API replicas behind nginx, two workers, one PostgreSQL.

    .venv/bin/python bench/bench_scale.py [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]
        [--clients 16] [--phase-seconds 30] [--fault-seconds 60] [--replicas 3]

Needs a PostgreSQL server (the URL of a database it may create others from) and nginx on the PATH
(Debian: apt-get install nginx). It creates a throw-away database and a temporary SQA_HOME with the
shipped sample, ingested through 2024-02 (hash encoder, first-entity reader: the load is on the
serving machinery, not a model), starts --replicas `sqa serve` processes on that database and home,
and runs two phases, each through nginx (`deploy/nginx.conf`'s retry rule: an answer that fails on
one replica is tried on the next):

1. throughput: --clients clients send dated questions back to back for --phase-seconds, through
   1, 2, ... --replicas replicas; requests/s, p50/p95 and errors for each, and the ratio to one;
2. faults, for --fault-seconds with every replica: two workers start the scheduled ingest of
   2024-03 at once (`app.bootstrap.scheduled_monthly_ingest`, as `sqa worker` calls it, with a
   slowed encoder); the one that holds the period is killed (-9), then one replica is killed (-9).
   Every replica left swaps to the new snapshot when the other worker's ingest commits.

It reports errors (anything but 200 other than the admission gate's 503s: target 0), the month's
scheduled runs (target: exactly one succeeded) and the month's passages (indexed once: the serving
snapshot's ids equal the passage rows, none twice).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import create_engine, func, select, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.server_process import free_port, served  # noqa: E402
from bench.bench_answers import SAMPLE  # noqa: E402
from bench.scale_load import load, load_wrk  # noqa: E402
from indexer.importers import read_realtimeqa  # noqa: E402
from settings import Settings  # noqa: E402
from store.scratch import scratch_database  # noqa: E402
from store.tables import Job, Passage  # noqa: E402

MONTH = "2024-03"


def build_home(home: Path, db_url: str) -> None:
    from app.bootstrap.builders import build_encoder, open_database  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
    from app.bootstrap.job_configs import ingest_config  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
    from workers.imports import store_records  # noqa: PLC0415 (lazy: workers.imports pulls faiss)
    from workers.ingest import ingest  # noqa: PLC0415 (lazy: workers.ingest pulls faiss)

    settings = Settings(home=home, database_url=db_url, encoder="hash")
    db = open_database(settings)
    try:
        articles, questions, _ = read_realtimeqa(SAMPLE)
        store_records(db.sessions, articles, questions)
        ingest(db.sessions, build_encoder(settings), ingest_config(settings), {"through": "2024-02"})
    finally:
        db.close()


@contextlib.contextmanager
def nginx(ports: list[int], workdir: Path):
    """nginx on a free port in front of 127.0.0.1:ports, with deploy/nginx.conf's retry rule."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    upstream = "\n".join(f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=5s;" for p in ports)
    conf = workdir / "nginx.conf"
    conf.write_text(f"""
user root;
worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {workdir}/body;
    proxy_temp_path {workdir}/proxy;
    fastcgi_temp_path {workdir}/fastcgi;
    uwsgi_temp_path {workdir}/uwsgi;
    scgi_temp_path {workdir}/scgi;
    upstream api {{
{upstream}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port};
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_read_timeout 120s;
        location /v1/answers {{
            proxy_pass http://api;
            proxy_next_upstream error timeout http_502 http_503 http_504 non_idempotent;
            proxy_next_upstream_tries 3;
        }}
        location / {{
            proxy_pass http://api;
            proxy_next_upstream error timeout;
        }}
    }}
}}
""")
    proc = subprocess.Popen(
        ["nginx", "-c", str(conf), "-p", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )

    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"nginx did not start: {(workdir / 'error.log').read_text()[-2000:]}")
        time.sleep(0.2)
    try:
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def worker_process(env: dict, log: Path) -> subprocess.Popen:
    code = (
        "from app.bootstrap import scheduled_monthly_ingest; "
        f"job = scheduled_monthly_ingest({MONTH!r}); print(job['state'], job['message'])"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT
    )


def month_check(db_url: str, home: Path) -> dict:
    """The month's scheduled runs and ingests, and whether the serving snapshot indexes its passages once."""
    from app.bootstrap.builders import open_database  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
    from serving.index_state import IndexState  # noqa: PLC0415 (lazy: serving.index_state pulls faiss)

    settings = Settings(home=home, database_url=db_url, encoder="hash")
    db = open_database(settings, migrate=False)
    try:
        with db.sessions() as s:
            runs = [
                (j.kind, j.state)
                for j in s.scalars(select(Job).where(Job.kind.in_(("monthly-ingest", "ingest"))).order_by(Job.id))
                if (j.params or {}).get("period") == MONTH or (j.params or {}).get("month") == MONTH
            ]
        state = IndexState(db.sessions, settings.index_dir, encoder="hash-384", dim=384)
        state.refresh()  # checksums, and ids against the database
        snap = state.current()
        shard = next((sh for sh in snap.index.shards if sh.key == MONTH), None)
        ids = shard.ids() if shard is not None else np.array([], dtype=np.int64)
        with db.sessions() as s:
            rows = (
                s.scalar(select(func.count()).select_from(Passage).where(Passage.faiss_id.in_(ids.tolist())))
                if len(ids)
                else 0
            )
        return {
            "runs": runs,
            "snapshot": snap.snapshot_id,
            "month_vectors": int(len(ids)),
            "unique_ids": int(len(set(ids.tolist()))),
            "rows_for_ids": int(rows),
        }
    finally:
        db.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--postgres",
        default=os.environ.get("SQA_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    )
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--phase-seconds", type=float, default=30.0)
    ap.add_argument("--fault-seconds", type=float, default=60.0)
    ap.add_argument(
        "--load",
        choices=["python", "wrk"],
        default="wrk" if shutil.which("wrk") else "python",
        help="the throughput phase's load generator: wrk (Debian: apt-get install wrk; the default "
        "where it is on the PATH) or Python threads (httpx), which share the cores with the servers",
    )
    ap.add_argument("--encode-delay-ms", type=int, default=400, help="the workers' slowed encoder (per batch of 2)")
    args = ap.parse_args()
    if shutil.which("nginx") is None:
        print("nginx is not on the PATH (Debian: apt-get install nginx)", file=sys.stderr)
        return 2
    with (
        tempfile.TemporaryDirectory(prefix="sqa-scale-") as tmp,
        scratch_database(args.postgres, "sqa_scale") as db_url,
    ):
        tmp = Path(tmp)
        home = tmp / "home"
        build_home(home, db_url)
        env = {
            **os.environ,
            "SQA_HOME": str(home),
            "SQA_DATABASE_URL": db_url,
            "SQA_ENCODER": "hash",
            "SQA_READER": "first-entity",
            "SQA_SNAPSHOT_POLL_S": "1",
            "SQA_RATE_LIMIT": "",
            "SQA_MIGRATE": "0",
            "SQA_TORCH_THREADS": "1",
            "SQA_AUTO_TRAIN": "false",
            "SQA_ANSWER_QUEUE": "64",
            "SQA_ANSWER_CACHE": "0",  # every answer computed: the pipeline is measured, not the answer cache
        }
        ports = [free_port() for _ in range(args.replicas)]
        with contextlib.ExitStack() as stack:
            replicas = [stack.enter_context(served(env, tmp / f"replica-{i}.log", port=p)) for i, p in enumerate(ports)]
            print(
                f"{args.replicas} replicas ready on one PostgreSQL database and one SQA_HOME; {os.cpu_count()} cores",
                flush=True,
            )
            phases = []
            for n in range(1, args.replicas + 1):
                with nginx(ports[:n], tmp / f"nginx-{n}") as base:
                    load(base, args.clients, 3)  # warm-up, not counted
                    figures = (
                        load_wrk(base, args.clients, args.phase_seconds, tmp)
                        if args.load == "wrk"
                        else load(base, args.clients, args.phase_seconds)
                    )
                phases.append((n, figures))
                print(
                    f"  {n} replica(s): {figures['per_s']:7.1f} answers/s  p50 {figures['p50_ms']:6.0f} ms  "
                    f"p95 {figures['p95_ms']:6.0f} ms  errors {figures['errors']}  503 {figures['refused_503']}",
                    flush=True,
                )

            # Faults: two workers race for the month, the holder is killed, then a replica is.
            wenv = {
                **env,
                "SQA_ENCODER": f"hash:delay_ms={args.encode_delay_ms}",
                "SQA_ENCODE_BATCH_SIZE": "2",
                "SQA_CHECKPOINT_EVERY": "4",
            }
            workers: list[subprocess.Popen] = []
            killed: dict[str, str] = {}

            def start_workers() -> None:
                workers.extend(worker_process(wenv, tmp / f"worker-{i}.log") for i in range(2))

            def kill_holder() -> None:
                """Kill the worker whose run holds the month, once its ingest is under way."""
                engine = create_engine(db_url)
                pid, deadline = None, time.monotonic() + 60
                with engine.connect() as conn:
                    while pid is None and time.monotonic() < deadline:
                        pid = conn.execute(
                            text(
                                "SELECT m.pid FROM jobs m JOIN jobs i ON i.pid = m.pid WHERE m.kind = 'monthly-ingest' "
                                "AND m.state = 'running' AND i.kind = 'ingest' AND i.state = 'running' "
                                "AND i.progress > 0.1"
                            )
                        ).scalar()
                        conn.rollback()
                        time.sleep(0.1)
                engine.dispose()
                victim = next((w for w in workers if w.pid == pid), None)
                if victim is None:
                    killed["worker"] = "none: no worker's ingest was seen under way"
                    return
                victim.send_signal(signal.SIGKILL)
                killed["worker"] = f"pid {victim.pid}, the holder, its ingest under way"

            def kill_replica() -> None:
                replicas[-1].process.send_signal(signal.SIGKILL)
                killed["replica"] = f"port {ports[-1]}"

            with nginx(ports, tmp / "nginx-faults") as base:
                faults = load(
                    base,
                    args.clients,
                    args.fault_seconds,
                    events=[(3, start_workers), (5, kill_holder), (args.fault_seconds * 0.5, kill_replica)],
                )
                for w in workers:
                    w.wait(timeout=600)
                time.sleep(3)  # the replicas' snapshot poll (1 s)

                served_snapshots = [
                    httpx.get(f"{r.base}/readyz", timeout=5).json().get("snapshot") for r in replicas[:-1]
                ]
            check = month_check(db_url, home)
            worker_out = [(tmp / f"worker-{i}.log").read_text().strip().splitlines()[-1:] for i in range(2)]

    one = phases[0][1]["per_s"] or float("nan")
    print(
        f"\nthroughput ({args.clients} clients, {args.phase_seconds:g} s each, hash encoder, first-entity reader, "
        f"{os.cpu_count()} cores; load from {args.load}, which shares the cores with nginx and the replicas):"
    )
    for n, f in phases:
        print(
            f"  {n} replica(s): {f['per_s']:7.1f} answers/s ({f['per_s'] / one:4.2f}x one)  p50 {f['p50_ms']:5.0f} ms  "
            f"p95 {f['p95_ms']:5.0f} ms  errors {f['errors']}  refused 503 {f['refused_503']}"
        )
    print(
        f"\nfaults ({args.fault_seconds:g} s, {args.replicas} replicas): killed worker {killed.get('worker')}, "
        f"replica {killed.get('replica')}"
    )
    print(
        f"  requests {faults['requests']}, answered {faults['answered']} ({faults['per_s']:.1f}/s), "
        f"refused 503 {faults['refused_503']}, errors {faults['errors']}  p50 {faults['p50_ms']:.0f} ms "
        f"p95 {faults['p95_ms']:.0f} ms"
    )
    for e in faults["error_examples"]:
        print(f"    error: {e}")
    print(f"  workers: {worker_out}")
    succeeded = [r for r in check["runs"] if r == ("monthly-ingest", "succeeded")]
    print(f"  {MONTH} runs (kind, state, in order): {check['runs']}")
    print(f"  scheduled runs of {MONTH} that succeeded: {len(succeeded)} (target 1)")
    print(
        f"  serving snapshot {check['snapshot']}: {check['month_vectors']} vectors of {MONTH}, "
        f"{check['unique_ids']} distinct ids, {check['rows_for_ids']} passage rows for them"
    )
    print(
        f"  replicas left serving it: {sum(s == check['snapshot'] for s in served_snapshots)} of "
        f"{len(served_snapshots)}"
    )
    ok = (
        faults["errors"] == 0
        and len(succeeded) == 1
        and check["month_vectors"] == check["unique_ids"] == check["rows_for_ids"] > 0
        and all(s == check["snapshot"] for s in served_snapshots)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
