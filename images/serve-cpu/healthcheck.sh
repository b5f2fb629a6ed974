#!/usr/bin/env bash
# serve-cpu's health, for Docker's HEALTHCHECK (compose) and the Kubernetes probes. The image has no curl
# or wget, so this speaks HTTP to the local REST port over bash's /dev/tcp. With TLS on (tls-config.sh) only
# gRPC is encrypted: the REST port stays plaintext, in TF Serving and serve-local alike, so nothing here changes.
#
#   healthcheck.sh [ready]  SERVING: every model named in the models.config in force (mounted, or generated
#                           from MODEL_NAME; see models-config.sh) has a version AVAILABLE.
#                           Docker/compose "healthy", Kubernetes readiness.
#   healthcheck.sh live     the PROCESS ANSWERS, whatever its models' state. TF Serving keeps its ports
#                           closed until the initial models are AVAILABLE, which lasts as long as the
#                           first training (an hour on a GPU): a closed port means "waiting", not "dead"
#                           (the server is PID 1; were it dead, the container would have exited). Once
#                           the port is open, the server must answer HTTP within 2 s, any status.
#                           Kubernetes liveness: a pod is never restarted for having nothing to serve.
set -uo pipefail
# shellcheck source=models-config.sh
source "${TRAINSERVE_LIB:-/usr/local/lib/trainserve}/models-config.sh"

get() {  # get PATH: the raw HTTP response of the local REST port; status 2 when nothing listens
  local fd
  { exec {fd}<>"/dev/tcp/127.0.0.1/${REST_PORT:-8501}"; } 2>/dev/null || return 2
  printf 'GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n' "$1" >&"$fd"
  timeout 2 cat <&"$fd"
}

config=$(model_config_file)
mapfile -t models < <(configured_models "$config" 2>/dev/null)

case "${1:-ready}" in
  ready)
    ((${#models[@]})) || { echo "no model named in $config (yet)"; exit 1; }
    for model in "${models[@]}"; do
      response=$(get "/v1/models/$model")
      grep -Eq '"state" *: *"AVAILABLE"' <<<"$response" || { echo "model $model: no version AVAILABLE"; exit 1; }
    done
    echo "serving: ${models[*]}"
    ;;
  live)
    response=$(get "/v1/models/${models[0]:-${MODEL_NAME:-model}}")
    [[ $? -eq 2 ]] && { echo "REST port not open yet: waiting for the initial models"; exit 0; }
    [[ "$response" == HTTP/* ]] || { echo "the REST port is open but no HTTP answer came within 2 s"; exit 1; }
    echo "answering: ${response%%$'\r'*}"
    ;;
  *)
    echo "usage: healthcheck.sh [ready|live]" >&2
    exit 2
    ;;
esac
