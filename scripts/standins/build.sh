#!/usr/bin/env bash
# Build the STAND-IN base images the end-to-end tests use where no container registry can be reached.
# They exist for tests only; users build on the real images (tensorflow/tensorflow:<v>-gpu,
# tensorflow/serving:<v>, python:3.11-slim-bookworm). Our Dockerfiles are unchanged: only BASE_IMAGE differs.
#
#   trainserve-standin/debian:bookworm          debootstrap'ed Debian (minbase) + python3 (docker import)
#   trainserve-standin/python:3.11-slim         ... + a venv on PATH          (for python:3.11-slim-bookworm)
#   trainserve-standin/tensorflow:<v>-gpu       ... + tensorflow-cpu==<v>      (for tensorflow/tensorflow:<v>-gpu)
#   trainserve-standin/serving:<v>              ... + tensorflow_model_server = `trainserve serve-local`
#                                                                               (for tensorflow/serving:<v>)
# TensorFlow and serve-local's other dependencies are not downloaded again: they are copied in from this
# checkout's environment (`make venv` installed them from uv.lock: the same wheels, checked against the pins of
# requirements/serve.txt by site_files.py). From nothing, debootstrap and TensorFlow's 1.5 GB were most of the
# time. An image is rebuilt only when what it is made from changes: a second run takes seconds. Each step
# prints its time.
set -euo pipefail
cd "$(dirname "$0")/../.."

TF_VERSION=${TF_VERSION:-$(sed -n 's/.*"tensorflow-cpu==\([0-9.]*\)".*/\1/p' pyproject.toml)}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
PYTHON=${PYTHON:-.venv/bin/python}  # the environment whose installed packages the stand-ins copy
STANDIN=${STANDIN:-trainserve-standin}  # the images' repository prefix (the tests use the default)
here=scripts/standins
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT

have() { docker image inspect "$1" >/dev/null 2>&1; }
# Each step's time, also appended to $STANDINS_TIMES when set (.ci/run prints it: pytest keeps this output).
took() { echo "standins: $1 in $((SECONDS - $2)) s" | tee -a "${STANDINS_TIMES:-/dev/null}"; }

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
# ... and of the packages a file list holds (their dist-info folders name the versions; byte code is a cache).
list_hash() { grep '\.dist-info/' "$1" | sort | sha256sum | cut -c1-16; }

present() { [[ "$(docker image inspect -f '{{index .Config.Labels "trainserve.content"}}' "$1" 2>/dev/null)" == "$2" ]]; }

# build TAG DOCKERFILE HASH FILES [BUILD ARGS...]: the context is the Dockerfile plus the paths listed in FILES,
# resolved through $context's links (site/ -> site-packages, src/ -> the source), sent to the engine as one tar.
build() {
  local tag=$1 dockerfile=$2 hash=$3 files=$4 started=$SECONDS
  shift 4
  if present "$tag" "$hash"; then
    echo "standins: $tag present (content $hash)"
    return
  fi
  echo "standins: building $tag (content $hash)"
  cp "$dockerfile" "$context/Dockerfile"
  { echo Dockerfile; cat "$files"; } | tar -c -h -C "$context" -T - \
    | docker build --quiet --network host --label "trainserve.content=$hash" -t "$tag" \
      --build-arg "STANDIN=$STANDIN" "$@" - >/dev/null
  took "$tag" "$started"
}

if ! have "$STANDIN/debian:bookworm"; then
  started=$SECONDS
  rootfs=$context/rootfs
  echo "standins: debootstrap bookworm from $(debian_mirror)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$(debian_mirror)" \
    >/dev/null
  # The host's CA bundle, so pip inside these test images trusts what the host trusts.
  cp "$CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$STANDIN/debian:bookworm" >/dev/null
  rm -rf "$rootfs"
  took "$STANDIN/debian:bookworm (debootstrap, import)" "$started"
fi

: >"$context/none"
build "$STANDIN/python:3.11-slim" "$here/python.Dockerfile" "$(content_hash "$here/python.Dockerfile")" "$context/none"
[[ "${1:-}" != base ]] || exit 0  # .ci/run: these two need no Python environment, so they build during `make venv`

site=$("$PYTHON" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
ln -s "$site" "$context/site"
ln -s "$PWD/src" "$context/src"
site_files() { "$PYTHON" "$here/site_files.py" requirements/serve.txt "$@" | sed 's,^,site/,'; }
site_files --closure-of tensorflow-cpu >"$context/tensorflow.files"
tag="$STANDIN/tensorflow:${TF_VERSION}-gpu"
# The packages travel with the byte code `make venv` compiled (--compile-bytecode), so a read-only container
# imports TensorFlow without compiling it first.
hash="$(content_hash "$here/tensorflow.Dockerfile")-$(list_hash "$context/tensorflow.files")-$TF_VERSION"
build "$tag" "$here/tensorflow.Dockerfile" "$hash" "$context/tensorflow.files"

# It carries serve-local, so it is rebuilt whenever the source changes.
site_files --without-closure-of tensorflow-cpu >"$context/serving.files"
find src/trainserve -type f -not -path '*/__pycache__/*' >>"$context/serving.files"
build "$STANDIN/serving:${TF_VERSION}" "$here/serving.Dockerfile" \
  "$(content_hash "$here/serving.Dockerfile" src)-$(list_hash "$context/serving.files")-$TF_VERSION" \
  "$context/serving.files" --build-arg "TF_VERSION=$TF_VERSION"
