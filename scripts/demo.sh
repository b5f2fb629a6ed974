#!/usr/bin/env bash
# `make demo`: the whole pipeline on this machine, no Docker and no GPU:
# train -> CPU gate -> publish version -> serve-local (TF Serving's APIs) -> batched gRPC eval -> report.
set -euo pipefail

BIN=${BIN:-.venv/bin}
DIR=${DEMO_DIR:-demo}
MODEL=${MODEL_NAME:-digits}
EPOCHS=${DEMO_EPOCHS:-20}
GRPC_PORT=${GRPC_PORT:-8500}
REST_PORT=${REST_PORT:-8501}

# The server starts first, as TF Serving would: it waits for the first version while training runs, so its
# own start (importing TensorFlow) is not added to the demo's time. Its ports open once the version is loaded.
mkdir -p "$DIR/reports"
"$BIN/trainserve" serve-local --port="$GRPC_PORT" --rest_api_port="$REST_PORT" \
  --model_name="$MODEL" --model_base_path="$(cd "$DIR" && pwd)/models/$MODEL" >"$DIR/serve-local.log" 2>&1 &
server=$!
stop_server() {
  kill -TERM "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}
trap stop_server EXIT

trained=$("$BIN/trainserve" train --model-name "$MODEL" --epochs "$EPOCHS" \
  --export-base "$DIR/models" --data-dir "$DIR/data" --logs-dir "$DIR/logs")
echo "$trained"
# The version this run published: the eval below asks for it (the server may still hold an older one).
version=$(sed -n "s/^published $MODEL version \([0-9]*\) at .*/\1/p" <<<"$trained")

if ! "$BIN/trainserve" eval --server "localhost:$GRPC_PORT" --model "$MODEL" --version "${version:?}" \
  --data-dir "$DIR/data" --data held-out \
  --report "$DIR/reports/eval.json" --plots "$DIR/reports" --min-accuracy 0.9 --wait 120; then
  echo "demo: eval failed; the last lines of $DIR/serve-local.log:" >&2
  tail -n 5 "$DIR/serve-local.log" >&2
  exit 1
fi
echo
# The server stops with this script (trap above): say how to start it again before pointing at its REST port.
echo "demo: model $MODEL published in $DIR/models/$MODEL; the demo's server has stopped. Serve it again and ask it:"
echo "demo:   $BIN/trainserve serve-local --port=$GRPC_PORT --rest_api_port=$REST_PORT --model_name=$MODEL --model_base_path=$DIR/models/$MODEL &"
echo "demo:   curl localhost:$REST_PORT/v1/models/$MODEL"
echo "demo: training logs in $DIR/logs, eval report and plots in $DIR/reports, server log $DIR/serve-local.log"
