#!/usr/bin/env bash
# Start tensorflow_model_server with CPU-tuned flags; exec'd, so the server is PID 1 and gets signals.
#
# Which models: a mounted models.config rules; without one, the model named by $MODEL_NAME is served from
# /models/$MODEL_NAME (models.config.template, written to /tmp/trainserve/models.config here). So the one
# MODEL_NAME that training publishes under is the one serving loads (models-config.sh has the rules).
#
# Version labels (gated rollout): a restart must accept the labels in its config although nothing is loaded
# when TF Serving first checks them, hence --allow_version_labels_for_unavailable_models (moving a label
# still needs its new version AVAILABLE, which `trainserve candidate` waits for). The config is re-read every
# MODEL_CONFIG_POLL_WAIT_SECONDS (10): a promotion or rollback is served within that.
#
# TLS: a certificate mounted in /etc/trainserve/tls (tls.crt, tls.key, optional ca.crt: a kubernetes.io/tls
# Secret) turns gRPC into TLS, mutual with ca.crt, through the SSLConfig tls-config.sh writes; none: plaintext.
#
# TF Serving sizes its thread pools from the CPUs it can schedule on, not from the container's CPU
# limit: 16 threads on a 2-CPU quota thrash. So both parallelism flags come from the cgroup quota.
set -euo pipefail
# shellcheck source=models-config.sh
source "${TRAINSERVE_LIB:-/usr/local/lib/trainserve}/models-config.sh"
# shellcheck source=tls-config.sh
source "${TRAINSERVE_LIB:-/usr/local/lib/trainserve}/tls-config.sh"
CONFIG_DIR=${TRAINSERVE_CONFIG_DIR:-/etc/trainserve}

fail() {
  echo "serve-cpu: error: $*" >&2
  exit 64
}

model_name_config() {  # the template with $MODEL_NAME in it, on stdout
  # The same names training accepts; nothing else can reach the generated text proto.
  [[ "${MODEL_NAME:-}" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] ||
    fail "MODEL_NAME '${MODEL_NAME:-}': expected letters, digits, '-', '_' or '.' (the name training publishes under)"
  local template placeholder='${MODEL_NAME}'
  template=$(<"$TEMPLATE")
  printf '%s\n' "${template//"$placeholder"/"$MODEL_NAME"}"
}

# gRPC over TLS when a certificate is mounted (tls-config.sh); plaintext otherwise, as without TLS.
ssl=$(ssl_config) || exit $?
tls_flags=()
if [[ -n "$ssl" ]]; then
  tls_flags=(--ssl_config_file="$ssl")
  echo "serve-cpu: gRPC over TLS from $TLS_DIR ($(grep -o 'client_verify: .*' "$ssl")); REST stays plaintext" >&2
fi

config=$(model_config_file)
if [[ "$config" == "${ROLLOUT_CONFIG_FILE:-}" && ! -e "$config" ]]; then
  # Gated rollout, before the first `trainserve candidate`: start the config it will rewrite as MODEL_NAME's
  # (newest versions, no labels) where this container may write (compose: the `rollout` volume), so serving
  # works as without rollout until then; `ln` never replaces one written meanwhile. Where it may not
  # (Kubernetes: the models volume is read-only here), wait for the promote Job's `trainserve candidate`.
  body=$(model_name_config)
  staged="$config.serve-cpu-$$"
  if printf '%s\n' "$body" >"$staged" 2>/dev/null; then
    ln "$staged" "$config" 2>/dev/null || true
    rm -f "$staged"
    echo "serve-cpu: started the rollout config $config from MODEL_NAME '$MODEL_NAME' (no labels yet)" >&2
  fi
  while [[ ! -e "$config" ]]; do
    [[ -n "${waiting:-}" ]] || echo "serve-cpu: waiting for $config (written by trainserve candidate)" >&2
    waiting=1
    sleep "${ROLLOUT_WAIT_SECONDS:-5}"
  done
fi
if [[ "$config" == "$GENERATED_CONFIG" ]]; then
  body=$(model_name_config)
  mkdir -p "${GENERATED_CONFIG%/*}" 2>/dev/null && printf '%s\n' "$body" >"$GENERATED_CONFIG" 2>/dev/null ||
    fail "cannot write $GENERATED_CONFIG: give the container a writable /tmp (tmpfs, emptyDir) or mount a models.config"
  echo "serve-cpu: serving model '$MODEL_NAME' from /models/$MODEL_NAME (MODEL_NAME; no models.config mounted)" >&2
else
  [[ -r "$config" ]] || fail "cannot read the model config $config"
  models=$(configured_models "$config" | paste -sd ' ' -)
  echo "serve-cpu: serving the models named in $config: ${models:-none} (MODEL_NAME is not used)" >&2
fi

cpu_limit() {
  local quota period
  if [[ -r /sys/fs/cgroup/cpu.max ]]; then                       # cgroup v2: "max 100000" or "200000 100000"
    read -r quota period </sys/fs/cgroup/cpu.max
  elif [[ -r /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then        # cgroup v1
    quota=$(</sys/fs/cgroup/cpu/cpu.cfs_quota_us)
    period=$(</sys/fs/cgroup/cpu/cpu.cfs_period_us)
  fi
  if [[ -n "${quota:-}" && "$quota" != "max" && "$quota" -gt 0 ]]; then
    echo $(((quota + period - 1) / period))                       # round up: 1.5 CPUs -> 2 threads
  else
    nproc
  fi
}

cpus=$(cpu_limit)
intra=${TF_INTRA_OP_PARALLELISM:-$cpus}
inter=${TF_INTER_OP_PARALLELISM:-$cpus}
echo "serve-cpu: CPU limit ${cpus}; intra-op ${intra}, inter-op ${inter} threads" >&2

exec tensorflow_model_server \
  --port="${GRPC_PORT:-8500}" \
  --rest_api_port="${REST_PORT:-8501}" \
  --model_config_file="$config" \
  --model_config_file_poll_wait_seconds="${MODEL_CONFIG_POLL_WAIT_SECONDS:-10}" \
  --allow_version_labels_for_unavailable_models=true \
  --file_system_poll_wait_seconds=1 \
  --enable_batching=true \
  --batching_parameters_file="${BATCHING_PARAMETERS_FILE:-$CONFIG_DIR/batching.config}" \
  --monitoring_config_file="$CONFIG_DIR/monitoring.config" \
  --enable_model_warmup=true \
  --tensorflow_intra_op_parallelism="$intra" \
  --tensorflow_inter_op_parallelism="$inter" \
  "${tls_flags[@]}" \
  "$@"
