#!/usr/bin/env bash
# tinker-cookbook 0.6.1's supervised.train and rl.train, unmodified, against
# `taurl serve-tinker` serving SmolLM2-135M-Instruct on this machine (README.md).
# Usage: examples/tinker_cookbook/run.sh [OUT_DIR]   (default runs/cookbook)
# A quick smoke run: N_CONVERSATIONS=16 RL_STEPS=2 examples/tinker_cookbook/run.sh /tmp/smoke
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:-runs/cookbook}"
PORT="${PORT:-8765}"
N_CONVERSATIONS="${N_CONVERSATIONS:-64}"
RL_STEPS="${RL_STEPS:-20}"
MODEL_DIR="${TAURL_HOME:-$HOME/.cache/taurl}/models/smollm2-135m-instruct"
export TINKER_API_KEY="${TINKER_API_KEY:-tml-local}"  # the server accepts any tml- key
export TINKER_TELEMETRY=0 HF_HUB_OFFLINE=1  # nothing leaves the machine

mkdir -p "$OUT"
taurl models import smollm2-135m-instruct  # once: GGUF -> $MODEL_DIR
taurl serve-tinker --model "$MODEL_DIR" --run-dir "$OUT/server" --port "$PORT" \
    > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER' EXIT
until grep -q "serving the Tinker API" "$OUT/server.log"; do sleep 1; done

BASE="http://127.0.0.1:$PORT"
python "$HERE/make_sft_jsonl.py" --out "$OUT/sft.jsonl" --n "$N_CONVERSATIONS"
python "$HERE/train_sft.py" --base-url "$BASE" --model "$MODEL_DIR" \
    --data "$OUT/sft.jsonl" --log-path "$OUT/sft"
python "$HERE/summarize.py" sft "$OUT/sft"
python "$HERE/train_rl.py" --base-url "$BASE" --model "$MODEL_DIR" \
    --log-path "$OUT/rl" --steps "$RL_STEPS" --lr 1e-3 --seed 1
python "$HERE/summarize.py" rl "$OUT/rl" --window "$(( RL_STEPS < 10 ? 1 : 5 ))"
