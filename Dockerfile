# syntax=docker/dockerfile:1
# The ttft-monitor image. Build from the repository root:
#   docker build -t ttft-monitor:0.1.0 .
# Try it against the example config (SQLite in the container, metrics and the status pages on :9464).
# Listening on every interface, the pages need auth: the example config takes web.token_env from
# TTFT_WEB_AUTH_ENV (set below), so pass the token in a file or an --env-file, never on the command line:
#   openssl rand -hex 32 > web-token
#   docker run --rm -p 9464:9464 -v "$PWD/config.yaml:/etc/ttft-monitor/config.yaml:ro" \
#     -v "$PWD/web-token:/run/secrets/web-token:ro" -e TTFT_WEB_TOKEN_FILE=/run/secrets/web-token ttft-monitor:0.1.0
# Kubernetes manifests: kubernetes/ (docs/deploy.md).

# ---- build: install the package and its dependencies into a venv, with compilers' leftovers left behind
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Same venv path as in the final stage: the scripts' #! lines name it.
RUN python -m venv /opt/ttft-monitor/.venv
WORKDIR /src
# .dockerignore keeps local state, caches and secrets out of this copy.
COPY . .
RUN /opt/ttft-monitor/.venv/bin/pip install .
# The alembic migrations ship inside the package (monitor._migrations), so nothing else to copy.

# ---- runtime: the venv on a clean slim image, as an unprivileged user
FROM python:3.11-slim
LABEL org.opencontainers.image.title="ttft-monitor" \
      org.opencontainers.image.description="Watches LLM endpoints' time to first token" \
      org.opencontainers.image.licenses="Apache-2.0"
# Unbuffered so log lines reach `kubectl logs` as they happen; no .pyc writes (the root fs is read-only
# in the shipped manifests, and pip compiled everything already). The example config.yaml keeps its
# state under $TTFT_STATE_DIR, listens on $TTFT_METRICS_LISTEN and protects the pages with the token
# in the variable $TTFT_WEB_AUTH_ENV names (the token itself is never baked in): set them for a container.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/ttft-monitor/.venv/bin:$PATH \
    TTFT_STATE_DIR=/var/lib/ttft-monitor \
    TTFT_METRICS_LISTEN=0.0.0.0:9464 \
    TTFT_WEB_AUTH_ENV=TTFT_WEB_TOKEN
# A fixed numeric uid: Kubernetes' runAsNonRoot can only check a numeric USER (the manifests use 10001).
RUN groupadd --system --gid 10001 ttft \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/ttft-monitor --no-create-home \
      --shell /usr/sbin/nologin ttft \
 && mkdir -p /var/lib/ttft-monitor /etc/ttft-monitor \
 && chown 10001:10001 /var/lib/ttft-monitor \
 && chmod 0700 /var/lib/ttft-monitor
COPY --from=build /opt/ttft-monitor/.venv /opt/ttft-monitor/.venv
USER 10001:10001
WORKDIR /var/lib/ttft-monitor
EXPOSE 9464
ENTRYPOINT ["ttft-monitor"]
CMD ["run", "--config", "/etc/ttft-monitor/config.yaml"]
