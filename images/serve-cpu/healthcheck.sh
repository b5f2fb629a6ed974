#!/usr/bin/env bash
# Healthy only when TF Serving's REST status reports a version of $MODEL_NAME AVAILABLE: a model-aware
# check, not an open port. The image has no curl or wget, so this speaks HTTP over bash's /dev/tcp.
set -uo pipefail
exec 3<>"/dev/tcp/127.0.0.1/${REST_PORT:-8501}" || exit 1
printf 'GET /v1/models/%s HTTP/1.0\r\nHost: localhost\r\n\r\n' "${MODEL_NAME:-digits}" >&3
response=$(timeout 2 cat <&3)
grep -Eq '"state" *: *"AVAILABLE"' <<<"$response"
