# The app image: `orapo serve` on port 7860, data in the /data volume.
# Kept in step with the Makefile: the same pinned constraints, the same CPU torch.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    HF_HUB_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    ORAPO_DATA_DIR=/data \
    ORAPO_HOST=0.0.0.0 \
    ORAPO_PORT=7860

WORKDIR /opt/orapo
COPY pyproject.toml constraints.txt README.md ./
COPY app ./app
COPY orapo_core ./orapo_core
COPY db ./db
COPY assets ./assets
# Every pin comes from constraints.txt (torch==2.13.0 as in pyproject.toml). A site that
# wants a smaller CPU-only image points pip at PyTorch's CPU wheel index with PIP_EXTRA_INDEX_URL.
ARG PIP_EXTRA_INDEX_URL=""
RUN pip install -c constraints.txt '.[postgres]' \
 && useradd --system --create-home --uid 1000 orapo \
 && mkdir -p /data && chown orapo /data

USER 1000
VOLUME ["/data"]
EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s CMD ["python", "-c", "import urllib.request,os; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"ORAPO_PORT\"]}/healthz', timeout=4)"]
ENTRYPOINT ["orapo"]
CMD ["serve"]
