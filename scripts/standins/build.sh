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
# An image is rebuilt only when the files it is made from change: a second run takes seconds.
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

# A hash of the files an image is made from: an image labelled with the same hash is reused as it is.
content_hash() {
  find "$@" -type f -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}

build() {  # build TAG DOCKERFILE HASH [BUILD ARGS...]: --network host so pip inside reaches the registry
  local tag=$1 dockerfile=$2 hash=$3
  shift 3
  if [[ "$(docker image inspect -f '{{index .Config.Labels "trainserve.content"}}' "$tag" 2>/dev/null)" == "$hash" ]]; then
    echo "standins: $tag present (content $hash)"
    return
  fi
  echo "standins: building $tag (content $hash)"
  # context: the repo, per .dockerignore
  docker build --quiet --network host --label "trainserve.content=$hash" -t "$tag" -f "$dockerfile" "$@" .
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
build trainserve-standin/python:3.11-slim "$here/python.Dockerfile" "$(content_hash "$here/python.Dockerfile")"
build "trainserve-standin/tensorflow:${TF_VERSION}-gpu" "$here/tensorflow.Dockerfile" \
  "$(content_hash "$here/tensorflow.Dockerfile")-$TF_VERSION" --build-arg "TF_VERSION=$TF_VERSION"
# It carries serve-local, so it is rebuilt whenever the source changes.
build "trainserve-standin/serving:${TF_VERSION}" "$here/serving.Dockerfile" \
  "$(content_hash "$here/serving.Dockerfile" requirements/serve.txt pyproject.toml README.md src)-$TF_VERSION" \
  --build-arg "TF_VERSION=$TF_VERSION"
