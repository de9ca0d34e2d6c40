# encoderrt's GPU image: CUDA 12 runtime, onnxruntime-gpu, TensorRT and torch's CUDA build (compile on first use).
#
#   docker build -f docker/cuda.Dockerfile -t encoderrt:cuda .
#   docker run --gpus all -p 8000:8000 -v encoderrt-cache:/cache encoderrt:cuda
#
# NOT YET RUN ON A GPU: written and checked as far as a machine without a GPU or a registry allows (docs/deployment.md).
# The same conventions as the CPU images: tini as PID 1, a non-root user, ENCODERRT_* variables, /models, /cache.

ARG BASE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04

FROM ${BASE}
ARG VERSION=0.1.0
ARG SOURCE=""
LABEL org.opencontainers.image.title="encoderrt" \
      org.opencontainers.image.description="Compiled serving for embedding models and rerankers, CUDA build" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="NOASSERTION"
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv tini ca-certificates \
    && apt-get clean && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/encoderrt \
    && useradd --system --uid 1001 --user-group --create-home --home-dir /home/encoderrt encoderrt \
    && mkdir -p /models /cache && chown encoderrt:encoderrt /models /cache
ENV PATH=/opt/encoderrt/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    ENCODERRT_CACHE=/cache \
    ENCODERRT_HOST=0.0.0.0 \
    ENCODERRT_PORT=8000
COPY pyproject.toml README.md /src/
COPY encoderrt /src/encoderrt
# onnxruntime-gpu replaces the CPU build (both install the `onnxruntime` module)
RUN pip install --index-url https://download.pytorch.org/whl/cu126 "torch>=2.4,<2.15" \
    && pip install "/src[compile,gpu,cuda]" \
    && pip uninstall --yes onnxruntime && pip install --force-reinstall --no-deps "onnxruntime-gpu>=1.20" \
    && rm -rf /src
WORKDIR /home/encoderrt
USER encoderrt
EXPOSE 8000
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=600s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ['ENCODERRT_PORT']}/health\", timeout=2)"]
ENTRYPOINT ["/usr/bin/tini", "--", "encoderrt"]
CMD ["serve"]
