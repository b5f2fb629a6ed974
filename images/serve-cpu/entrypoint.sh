#!/usr/bin/env bash
# Start tensorflow_model_server with CPU-tuned flags; exec'd, so the server is PID 1 and gets signals.
#
# Which models: a mounted models.config rules; without one, the model named by $MODEL_NAME is served from
# /models/$MODEL_NAME (models.config.template, written to /tmp/trainserve/models.config here). So the one
# MODEL_NAME that training publishes under is the one serving loads (models-config.sh has the rules).
#
# TF Serving sizes its thread pools from the CPUs it can schedule on, not from the container's CPU
# limit: 16 threads on a 2-CPU quota thrash. So both parallelism flags come from the cgroup quota.
set -euo pipefail
# shellcheck source=models-config.sh
source "${TRAINSERVE_LIB:-/usr/local/lib/trainserve}/models-config.sh"
CONFIG_DIR=${TRAINSERVE_CONFIG_DIR:-/etc/trainserve}

fail() {
  echo "serve-cpu: error: $*" >&2
  exit 64
}

config=$(model_config_file)
if [[ "$config" == "$GENERATED_CONFIG" ]]; then
  # The same names training accepts; nothing else can reach the generated text proto.
  [[ "${MODEL_NAME:-}" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] ||
    fail "MODEL_NAME '${MODEL_NAME:-}': expected letters, digits, '-', '_' or '.' (the name training publishes under)"
  template=$(<"$TEMPLATE")
  placeholder='${MODEL_NAME}'
  mkdir -p "${GENERATED_CONFIG%/*}" 2>/dev/null && printf '%s\n' "${template//"$placeholder"/"$MODEL_NAME"}" \
    >"$GENERATED_CONFIG" 2>/dev/null ||
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
  --model_config_file_poll_wait_seconds=60 \
  --file_system_poll_wait_seconds=1 \
  --enable_batching=true \
  --batching_parameters_file="${BATCHING_PARAMETERS_FILE:-$CONFIG_DIR/batching.config}" \
  --monitoring_config_file="$CONFIG_DIR/monitoring.config" \
  --enable_model_warmup=true \
  --tensorflow_intra_op_parallelism="$intra" \
  --tensorflow_inter_op_parallelism="$inter" \
  "$@"
