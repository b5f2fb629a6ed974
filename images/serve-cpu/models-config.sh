# Sourced by entrypoint.sh and healthcheck.sh: which ModelServerConfig is in force, and the models it names.
#   - a MOUNTED file rules: $MODEL_CONFIG_FILE when set, else /etc/trainserve/models.config when present
#     (a compose volume, a key added to the k8s serve-cpu-config ConfigMap);
#   - else $ROLLOUT_CONFIG_FILE when set (compose, k8s base): the config `trainserve candidate/promote/rollback` rewrite (gated
#     rollout, docs/tutorial/rollout.md); entrypoint.sh starts it from the template when absent;
#   - otherwise the config entrypoint.sh GENERATES at start from models.config.template and $MODEL_NAME,
#     in /tmp/trainserve (the root filesystem is read-only; /tmp is a tmpfs or an emptyDir).
# The paths can be moved (TRAINSERVE_CONFIG_DIR, TRAINSERVE_LIB, TRAINSERVE_RUN_DIR) so that tests run
# these scripts outside the image.
CONFIG_DIR=${TRAINSERVE_CONFIG_DIR:-/etc/trainserve}
TEMPLATE=${TRAINSERVE_LIB:-/usr/local/lib/trainserve}/models.config.template
GENERATED_CONFIG=${TRAINSERVE_RUN_DIR:-/tmp/trainserve}/models.config

model_config_file() {
  if [[ -n "${MODEL_CONFIG_FILE:-}" ]]; then
    echo "$MODEL_CONFIG_FILE"
  elif [[ -e "$CONFIG_DIR/models.config" ]]; then
    echo "$CONFIG_DIR/models.config"
  elif [[ -n "${ROLLOUT_CONFIG_FILE:-}" ]]; then
    echo "$ROLLOUT_CONFIG_FILE"
  else
    echo "$GENERATED_CONFIG"
  fi
}

# configured_models FILE: the `name` of every model in a ModelServerConfig text proto, one a line.
# (Comments dropped; `filename_prefix` and the like do not match: `name` must start a word.)
configured_models() {
  sed -e 's/#.*//' "$1" | grep -oE "(^|[^[:alnum:]_])name[[:space:]]*:[[:space:]]*[\"'][^\"']+" | sed -E "s/.*[\"']//"
}
