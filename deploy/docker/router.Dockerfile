# syntax=docker/dockerfile:1.7
# The Infera router: `infera-run serve` with every in-repo plugin (KV decoders and PD
# transports of each engine, policies, the native KV index, kubernetes and NATS backends).
#   docker build -f deploy/docker/router.Dockerfile -t infera-router:0.1.0 .
#   docker run -p 8000:8000 infera-router:0.1.0 --etcd-endpoint etcd:2379
ARG PYTHON_VERSION=3.11.11
ARG DEBIAN_RELEASE=bookworm
ARG INFERA_VERSION=0.1.0

# -- wheels: this repo's distributions plus every dependency, built once ---------------
# (the repo's own wheels are passed as files: never a same-named package from the index)
# the full python image has a C compiler (infera-kv-native is a C extension)
FROM python:${PYTHON_VERSION}-${DEBIAN_RELEASE} AS wheels
ARG UV_VERSION=0.9.7
RUN pip install --no-cache-dir "uv==${UV_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY infera_core ./infera_core
COPY plugins ./plugins
COPY native ./native
RUN for dist in . native/*/ plugins/*/; do uv build --wheel --out-dir /dist "$dist"; done \
 && pip wheel --no-cache-dir --wheel-dir /wheels /dist/*.whl

# -- the image: slim, no compiler, non-root ----------------------------------------------
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE}
ARG INFERA_UID=10001
ARG INFERA_VERSION
RUN useradd --system --uid "${INFERA_UID}" --user-group --create-home --home-dir /home/infera infera
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels \
      "infera-core==${INFERA_VERSION}" "infera-policies==${INFERA_VERSION}" \
      "infera-kv-native==${INFERA_VERSION}" "infera-vllm==${INFERA_VERSION}" \
      "infera-sglang==${INFERA_VERSION}" "infera-atom==${INFERA_VERSION}" \
      "infera-sim==${INFERA_VERSION}" "infera-k8s==${INFERA_VERSION}" "infera-nats==${INFERA_VERSION}" \
 && python -m compileall -q "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
COPY --chmod=0755 deploy/docker/entrypoint.sh /usr/local/bin/infera-entrypoint
COPY --chmod=0755 deploy/docker/healthcheck.py /usr/local/bin/infera-healthcheck
ENV INFERA_ROUTER_HOST=0.0.0.0 INFERA_ROUTER_PORT=8000 PYTHONUNBUFFERED=1
USER ${INFERA_UID}
WORKDIR /home/infera
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["infera-healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["infera-entrypoint", "serve"]
