#!/usr/bin/env bash
# Start tensorflow_model_server with CPU-tuned flags; exec'd, so the server is PID 1 and gets signals.
# TF Serving sizes its thread pools from the CPUs it can schedule on, not from the container's CPU
# limit: 16 threads on a 2-CPU quota thrash. So both parallelism flags come from the cgroup quota.
set -euo pipefail

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
  --model_config_file="${MODEL_CONFIG_FILE:-/etc/trainserve/models.config}" \
  --model_config_file_poll_wait_seconds=60 \
  --file_system_poll_wait_seconds=1 \
  --enable_batching=true \
  --batching_parameters_file="${BATCHING_PARAMETERS_FILE:-/etc/trainserve/batching.config}" \
  --monitoring_config_file=/etc/trainserve/monitoring.config \
  --enable_model_warmup=true \
  --tensorflow_intra_op_parallelism="$intra" \
  --tensorflow_inter_op_parallelism="$inter" \
  "$@"
