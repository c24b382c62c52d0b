#!/usr/bin/env bash
# One device call: the fast suite on the GPU (issue 31), then bench.rnn / bench.lm (issue 33).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 RHNZOO_DATA="$PWD/.gpudata" XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=$(command -v python || command -v python3)
{ date -u; echo "commit $(git rev-parse HEAD 2>/dev/null)"; nvidia-smi -L; nproc
  $PY -c "import jax, flax, optax, orbax.checkpoint as o; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
t0=$(date +%s)
timeout -k 5 290 $PY -m pytest -q -n 12 -m "not slow" -p no:cacheprovider -rfEs 2>&1 | tail -c 60000 > "$OUT/pytest.log"
echo "suite rc=$? in $(( $(date +%s) - t0 )) s"; grep -E "passed|failed" "$OUT/pytest.log" | tail -3
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -40
unset XLA_PYTHON_CLIENT_PREALLOCATE
t0=$(date +%s)
timeout -k 5 150 $PY -m rhnzoo.bench.rnn --configs=pmnist --cells=lstm,gru --unroll=4,8 --rounds=3 > "$OUT/rnn.jsonl" 2> "$OUT/rnn.log"
echo "rnn rc=$? in $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/rnn.log"
t0=$(date +%s)
for u in 1 5; do timeout -k 5 55 $PY -m rhnzoo.bench.lm --configs=ptb_sota --unroll=$u --budget_s=8 --eval_tokens=0 >> "$OUT/lm.jsonl" 2>> "$OUT/lm.log"; echo "lm u=$u rc=$?"; done
echo "lm in $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/lm.log"
