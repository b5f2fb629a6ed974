#!/usr/bin/env bash
# `make examples`: the three examples/ models (tabular regression, two-input binary classification, an
# LSTM over digit rows), each train -> CPU gate -> publish -> served together by one serve-local ->
# `trainserve eval` on its held-out split with the task's gate. No Docker, no GPU.
set -euo pipefail

BIN=${BIN:-.venv/bin}
DIR=${DEMO_DIR:-demo}/examples
GRPC_PORT=${GRPC_PORT:-8500}
REST_PORT=${REST_PORT:-8501}
# name:epochs:gate (the gate is `trainserve eval --require`: what a model that learned reaches)
EXAMPLES=(
  "diabetes_regression:30:r2>=0.3"
  "breast_cancer_two_inputs:20:accuracy>=0.9,roc_auc>=0.95"
  "digits_rows_lstm:15:accuracy>=0.5"
)

mkdir -p "$DIR/reports" "$DIR/models"
models=$(cd "$DIR/models" && pwd) # TF Serving wants absolute base paths
config="$DIR/models.config"
echo "model_config_list {" >"$config"
for example in "${EXAMPLES[@]}"; do
  IFS=: read -r name epochs _ <<<"$example"
  "$BIN/python" "examples/$name.py" "$DIR/$name.npz"
  "$BIN/trainserve" train --data "$DIR/$name.npz" --model-fn "examples/$name.py:build_model" --model-name "$name" \
    --epochs "$epochs" --learning-rate 0.01 --export-base "$DIR/models" --data-dir "$DIR/data" --logs-dir "$DIR/logs/$name"
  echo "  config { name: \"$name\" base_path: \"$models/$name\" model_platform: \"tensorflow\" }" >>"$config"
done
echo "}" >>"$config"

"$BIN/trainserve" serve-local --port="$GRPC_PORT" --rest_api_port="$REST_PORT" --model_config_file="$config" \
  >"$DIR/serve-local.log" 2>&1 &
server=$!
trap 'kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT

for example in "${EXAMPLES[@]}"; do
  IFS=: read -r name _ gate <<<"$example"
  "$BIN/trainserve" eval --server "localhost:$GRPC_PORT" --model "$name" --data "$DIR/data/$name/test.npz" \
    --require "$gate" --report "$DIR/reports/$name.json" --plots "$DIR/reports/$name" --wait 120
done
echo "examples: models in $DIR/models, reports and plots in $DIR/reports, server log $DIR/serve-local.log"
