#!/usr/bin/env bash
# `make examples`: the five examples/ models (tabular regression, two-input binary classification, an
# LSTM over digit rows, a CSV with text categories, empty cells and named classes, a folder of image files
# per class with the default model), each train -> CPU gate
# -> publish -> served together by one serve-local -> `trainserve eval` on its held-out data with the task's
# gate (the CSV example on its raw test.csv, labels by name). No Docker, no GPU.
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
  "iris_categories:60:accuracy>=0.85"
  "image_shapes:8:accuracy>=0.9"
)

# What each example trains and is evaluated on: its .npz and the shared split, or (CSV) its own files.
train_data() {
  case $1 in
    iris_categories) echo --data "$DIR/$1/train.csv" --label-column species --batch-size 16 --model-fn "examples/$1.py:build_model" ;;
    image_shapes) echo --data "$DIR/$1/" --image-size 32,32 --batch-size 16 ;;
    *) echo --data "$DIR/$1.npz" --model-fn "examples/$1.py:build_model" ;;
  esac
}
eval_data() {
  case $1 in
    iris_categories) echo --data "$DIR/$1/test.csv" --label-column species ;;
    image_shapes) echo --data "$DIR/data/$1/test/" ;;
    *) echo --data "$DIR/data/$1/test.npz" ;;
  esac
}

mkdir -p "$DIR/reports" "$DIR/models"
models=$(cd "$DIR/models" && pwd) # TF Serving wants absolute base paths
config="$DIR/models.config"
echo "model_config_list {" >"$config"
for example in "${EXAMPLES[@]}"; do
  IFS=: read -r name epochs _ <<<"$example"
  case $name in
    iris_categories | image_shapes) "$BIN/python" "examples/$name.py" "$DIR/$name" ;;
    *) "$BIN/python" "examples/$name.py" "$DIR/$name.npz" ;;
  esac
  # shellcheck disable=SC2046  # word splitting of the flags is intended (no spaces in $DIR)
  "$BIN/trainserve" train $(train_data "$name") --model-name "$name" \
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
  # shellcheck disable=SC2046
  "$BIN/trainserve" eval --server "localhost:$GRPC_PORT" --model "$name" $(eval_data "$name") \
    --require "$gate" --report "$DIR/reports/$name.json" --plots "$DIR/reports/$name" --wait 120
done
echo "examples: models in $DIR/models, reports and plots in $DIR/reports, server log $DIR/serve-local.log"
