# syntax=docker/dockerfile:1.7
# An Infera ATOM worker (ROCm): the ATOM image named by ATOM_BASE_IMAGE + `infera-run worker
# atom` (Infera in /opt/infera). ATOM workers register through etcd only.
#   docker build -f deploy/docker/atom.Dockerfile --build-arg ATOM_BASE_IMAGE=rocm/atom:<tag> -t infera-atom:0.1.0 .
#   docker run --device /dev/kfd --device /dev/dri infera-atom:0.1.0 --model m --etcd-endpoint etcd:2379
ARG PYTHON_VERSION=3.11.11
ARG INFERA_VERSION=0.1.0
# the ATOM image you run (ATOM's own Dockerfile builds one); pass its exact tag
ARG ATOM_BASE_IMAGE=rocm/atom:rocm7.0.0_atom_0.1.0

# -- wheels of this repo's distributions (pure Python: any interpreter of the base runs them)
#    and the sdist of infera-kv-native (compiled, if it can be, by the base's own Python)
FROM python:${PYTHON_VERSION}-slim-bookworm AS wheels
ARG UV_VERSION=0.9.7
RUN pip install --no-cache-dir "uv==${UV_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY infera_core ./infera_core
COPY plugins/infera-atom ./plugins/infera-atom
COPY native/infera-kv-native ./native/infera-kv-native
RUN for dist in . plugins/infera-atom; do uv build --wheel --out-dir /wheels "$dist"; done \
 && uv build --sdist --out-dir /wheels native/infera-kv-native

FROM ${ATOM_BASE_IMAGE}
ARG INFERA_VERSION
COPY --chmod=0755 deploy/docker/install-infera.sh deploy/docker/entrypoint.sh /usr/local/lib/infera/
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    UV_NO_CACHE=1 PIP_NO_CACHE_DIR=1 /usr/local/lib/infera/install-infera.sh /wheels \
      "infera-core==${INFERA_VERSION}" "infera-kv-native==${INFERA_VERSION}" \
      "infera-atom==${INFERA_VERSION}" \
 && ln -s /usr/local/lib/infera/entrypoint.sh /usr/local/bin/infera-entrypoint
ENV PATH=/opt/infera/bin:$PATH INFERA_ENGINE_PYTHON=/usr/local/bin/infera-engine-python \
    INFERA_ENGINE_HOST=0.0.0.0 INFERA_ENGINE_PORT=8000 PYTHONUNBUFFERED=1
EXPOSE 8000
STOPSIGNAL SIGTERM
ENTRYPOINT ["infera-entrypoint", "worker", "atom"]
