#!/usr/bin/env bash
# Container entrypoint: wait for the database, apply the migrations, then run the command
# (default: the API). Any `sqa` command works: docker compose run --rm api sqa ingest --through 2023-06
set -euo pipefail

if [ "$#" -eq 0 ]; then
    set -- sqa serve --host 0.0.0.0 --port 8000
fi

# Compose passes the database's host and user, and the password as a secret file: build the URL here
# (it then lives in this process's environment only, not in the compose file or `docker inspect`).
if [ -z "${SQA_DATABASE_URL:-}" ] && [ -n "${SQA_DATABASE_HOST:-}" ]; then
    secret="${SQA_DATABASE_PASSWORD_FILE:-/run/secrets/postgres_password}"
    if [ ! -r "$secret" ]; then
        echo "prestart: SQA_DATABASE_HOST is set but the password file $secret is missing" >&2
        exit 1
    fi
    SQA_DATABASE_URL="postgresql+psycopg://${SQA_DATABASE_USER:-sqa}:$(tr -d '\n' < "$secret")@${SQA_DATABASE_HOST}"
    export SQA_DATABASE_URL
fi

url="${SQA_DATABASE_URL:-}"
wait_s="${PRESTART_DB_WAIT_S:-60}"

case "$url" in
    postgres://* | postgresql://* | postgresql+*://*)
        where="${url##*@}"  # host:port/db, never the password
        echo "prestart: waiting up to ${wait_s}s for the database at ${where}"
        deadline=$((SECONDS + wait_s))
        until python - <<'PY'
import os
import sys

from sqlalchemy import create_engine, text

engine = create_engine(os.environ["SQA_DATABASE_URL"], connect_args={"connect_timeout": 3})
try:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
except Exception as exc:
    lines = str(exc).strip().splitlines()
    print(f"prestart:   not yet: {type(exc).__name__}: {lines[0] if lines else ''}", file=sys.stderr)
    sys.exit(1)
finally:
    engine.dispose()
PY
        do
            if [ "$SECONDS" -ge "$deadline" ]; then
                echo "prestart: the database at ${where} did not answer within ${wait_s}s:" \
                     "check that it is running and that SQA_DATABASE_URL is right" >&2
                exit 1
            fi
            sleep 2
        done
        echo "prestart: the database is up"
        ;;
esac

# One process applies the migrations (compose: the `migrate` service, before api and worker start);
# the others set SQA_MIGRATE=0 so that two of them never race on the same schema change.
if [ "${SQA_MIGRATE:-1}" != "0" ]; then
    sqa db upgrade
fi

exec "$@"
