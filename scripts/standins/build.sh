#!/usr/bin/env bash
# Build the STAND-IN base images the end-to-end tests use where no container registry can be reached.
# They exist for tests only; users build on the real images (tensorflow/tensorflow:<v>-gpu,
# tensorflow/serving:<v>, python:3.11-slim-bookworm). Our Dockerfiles are unchanged: only BASE_IMAGE differs.
#
#   trainserve-standin/debian:bookworm          debootstrap'ed Debian + python3 (docker import)
#   trainserve-standin/python:3.11-slim         ... + a venv on PATH          (for python:3.11-slim-bookworm)
#   trainserve-standin/tensorflow:<v>-gpu       ... + tensorflow-cpu==<v>      (for tensorflow/tensorflow:<v>-gpu)
#   trainserve-standin/serving:<v>              ... + tensorflow_model_server = `trainserve serve-local`
#                                                                               (for tensorflow/serving:<v>)
# Images already present are reused (the serving stand-in is rebuilt from cache): a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."

TF_VERSION=${TF_VERSION:?set TF_VERSION (make reads it from pyproject.toml)}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
here=scripts/standins

have() { docker image inspect "$1" >/dev/null 2>&1; }

# The Debian mirror this machine's apt already uses (deb822 or one-line sources).
debian_mirror() {
  local uri
  uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1)
  [[ -n "$uri" ]] || uri=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | head -n1)
  echo "${uri:?no Debian mirror found in /etc/apt/sources*}"
}

build() {  # build TAG DOCKERFILE [BUILD ARGS...]: --network host so pip inside reaches the registry
  local tag=$1 dockerfile=$2
  shift 2
  [[ -z "${FORCE:-}" ]] && have "$tag" && { echo "standins: $tag present"; return; }
  echo "standins: building $tag"
  docker build --quiet --network host -t "$tag" -f "$dockerfile" "$@" .  # context: the repo, per .dockerignore
}

if ! have trainserve-standin/debian:bookworm; then
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  echo "standins: debootstrap bookworm from $(debian_mirror)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$(debian_mirror)" \
    >/dev/null
  # The host's CA bundle, so pip inside these test images trusts what the host trusts.
  cp "$CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - trainserve-standin/debian:bookworm
fi
build trainserve-standin/python:3.11-slim "$here/python.Dockerfile"
build "trainserve-standin/tensorflow:${TF_VERSION}-gpu" "$here/tensorflow.Dockerfile" --build-arg "TF_VERSION=$TF_VERSION"
# Always rebuilt (layer cache makes it quick): it carries serve-local, so it must carry today's source.
FORCE=1 build "trainserve-standin/serving:${TF_VERSION}" "$here/serving.Dockerfile" --build-arg "TF_VERSION=$TF_VERSION"
