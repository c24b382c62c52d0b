#!/usr/bin/env bash
# The GPU measurements of issues 31 and 33, one part per device call (each < 10 min):
#
#   bash docs/runs/gpu/measure.sh suite   # the test suite on the GPU (issue 31 part 1)
#   bash docs/runs/gpu/measure.sh rnn     # bench.rnn: fused / reference / Flax / cuDNN, unroll k
#   bash docs/runs/gpu/measure.sh flags   # bench.rnn P-MNIST under XLA loop command buffers
#   bash docs/runs/gpu/measure.sh lm      # bench.lm ptb_sota / ptb_d40_hsg, unroll, bf16, trace
#
# Everything goes to $OUT (the device tool brings it back): JSONL per benchmark, logs,
# and env.txt (device, JAX version, commit, flags). Run from the repository root.
set -uo pipefail
OUT="${OUT:-/tmp/rhnzoo-gpu-out}"
mkdir -p "$OUT"
{
  date -u; git rev-parse HEAD 2>/dev/null || echo "commit: (no git)"; nvidia-smi -L
  python -c "import jax, jaxlib; print('jax', jax.__version__, jax.devices())"
  echo "XLA_FLAGS=${XLA_FLAGS:-}"
} > "$OUT/env.txt" 2>&1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

case "${1:-}" in
  suite)
    timeout 560 python -m pytest -q -n 8 -m "not slow" -p no:cacheprovider \
      > "$OUT/pytest.log" 2>&1
    tail -40 "$OUT/pytest.log" ;;
  rnn)
    timeout 560 python -m rhnzoo.bench.rnn --configs=pmnist,imdb --cells=lstm,gru,sc_lstm,rrn \
      --unroll=2,4,8 --bfloat16 --rounds=5 > "$OUT/rnn.jsonl" 2> "$OUT/rnn.log"
    tail -5 "$OUT/rnn.log"; cut -c1-300 "$OUT/rnn.jsonl" ;;
  flags)
    for f in "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL" \
             "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1"; do
      XLA_FLAGS="$f" timeout 250 python -m rhnzoo.bench.rnn --configs=pmnist --cells=lstm,gru \
        --unroll=4 --rounds=5 | sed "s|^{|{\"xla_flags\": \"$f\", |" >> "$OUT/rnn_flags.jsonl" \
        2>> "$OUT/rnn_flags.log"
    done
    cut -c1-300 "$OUT/rnn_flags.jsonl" ;;
  lm)
    for u in 1 5; do
      timeout 150 python -m rhnzoo.bench.lm --configs=ptb_sota,ptb_d40_hsg --unroll=$u \
        --budget_s=20 >> "$OUT/lm.jsonl" 2>> "$OUT/lm.log"
    done
    timeout 150 python -m rhnzoo.bench.lm --configs=ptb_sota,ptb_d40_hsg --dtype=bfloat16 \
      --budget_s=20 >> "$OUT/lm.jsonl" 2>> "$OUT/lm.log"
    timeout 100 python -m rhnzoo.bench.trace --cell=lstm --config=pmnist --top=40 \
      > "$OUT/trace_lstm_pmnist.txt" 2>&1
    cut -c1-300 "$OUT/lm.jsonl"; head -25 "$OUT/trace_lstm_pmnist.txt" ;;
  *)
    echo "usage: bash docs/runs/gpu/measure.sh suite|rnn|flags|lm" >&2; exit 2 ;;
esac
