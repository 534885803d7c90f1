#!/bin/sh
# infera-entrypoint: the ENTRYPOINT of every Infera image.
#   router image: infera-entrypoint serve            [docker run args…]
#   engine image: infera-entrypoint worker <engine>  [docker run args…] [-- engine flags]
# so `docker run IMAGE --model m --etcd-endpoint etcd:2379 -- --max-model-len 8192` works.
# In a container, bind every address (INFERA_ROUTER_HOST / INFERA_ENGINE_HOST=0.0.0.0; the
# old INFERA_HOST still counts for both) and advertise the pod/container
# IP: INFERA_ADVERTISE_HOST, else POD_IP (Kubernetes downward API), else the launcher's
# default (this machine's primary IP). Flags override all of them. exec: infera-run becomes PID 1
# (or tini's child) and receives SIGTERM itself, so a worker drains on `docker stop`.
set -eu

: "${INFERA_ROUTER_HOST:=${INFERA_HOST:-0.0.0.0}}"
: "${INFERA_ENGINE_HOST:=${INFERA_HOST:-0.0.0.0}}"
export INFERA_ROUTER_HOST INFERA_ENGINE_HOST
if [ -z "${INFERA_ADVERTISE_HOST:-}" ]; then
  if [ -n "${POD_IP:-}" ]; then
    INFERA_ADVERTISE_HOST=$POD_IP
    export INFERA_ADVERTISE_HOST
  fi
fi
if [ "$#" -eq 0 ]; then
  echo "infera-entrypoint: usage: infera-entrypoint serve|worker <engine> [flags]" >&2
  exit 2
fi
exec "${INFERA_RUN:-infera-run}" "$@"
