# syntax=docker/dockerfile:1.7
# An Infera vLLM worker: vLLM's own image + `infera-run worker vllm` (Infera in /opt/infera).
#   docker build -f deploy/docker/vllm.Dockerfile -t infera-vllm:0.1.0 .
#   docker build -f deploy/docker/vllm.Dockerfile --build-arg GPU=rocm -t infera-vllm:0.1.0-rocm .
#   docker run --gpus all infera-vllm:0.1.0 --model Qwen/Qwen3-8B --etcd-endpoint etcd:2379 -- --max-model-len 8192
ARG PYTHON_VERSION=3.11.11
ARG INFERA_VERSION=0.1.0
ARG GPU=cuda
ARG VLLM_IMAGE=vllm/vllm-openai:v0.11.0
ARG VLLM_ROCM_IMAGE=rocm/vllm:rocm7.0.0_vllm_0.11.2_20251210

# -- wheels of this repo's distributions (pure Python: any interpreter of the base runs them)
#    and the sdist of infera-kv-native (compiled, if it can be, by the base's own Python)
FROM python:${PYTHON_VERSION}-slim-bookworm AS wheels
ARG UV_VERSION=0.9.7
RUN pip install --no-cache-dir "uv==${UV_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY infera_core ./infera_core
COPY plugins/infera-vllm ./plugins/infera-vllm
COPY plugins/infera-k8s ./plugins/infera-k8s
COPY native/infera-kv-native ./native/infera-kv-native
RUN for dist in . plugins/infera-vllm plugins/infera-k8s; do uv build --wheel --out-dir /wheels "$dist"; done \
 && uv build --sdist --out-dir /wheels native/infera-kv-native

# -- the vendor base, CUDA or ROCm (only the chosen one is pulled) ---------------------------
FROM ${VLLM_IMAGE} AS base-cuda
FROM ${VLLM_ROCM_IMAGE} AS base-rocm

# base-cuda or base-rocm: both stages above pin their image (hadolint cannot see through ${GPU})
# hadolint ignore=DL3006
FROM base-${GPU}
ARG INFERA_VERSION
COPY --chmod=0755 deploy/docker/install-infera.sh deploy/docker/entrypoint.sh /usr/local/lib/infera/
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    UV_NO_CACHE=1 PIP_NO_CACHE_DIR=1 /usr/local/lib/infera/install-infera.sh /wheels \
      "infera-core==${INFERA_VERSION}" "infera-kv-native==${INFERA_VERSION}" \
      "infera-vllm==${INFERA_VERSION}" "infera-k8s==${INFERA_VERSION}" \
 && ln -s /usr/local/lib/infera/entrypoint.sh /usr/local/bin/infera-entrypoint
ENV PATH=/opt/infera/bin:$PATH INFERA_ENGINE_PYTHON=/usr/local/bin/infera-engine-python \
    INFERA_ENGINE_HOST=0.0.0.0 INFERA_ENGINE_PORT=8000 PYTHONUNBUFFERED=1
EXPOSE 8000
STOPSIGNAL SIGTERM
ENTRYPOINT ["infera-entrypoint", "worker", "vllm"]
