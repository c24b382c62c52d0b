#!/usr/bin/env bash
# Second device call: the 5 GPU failures' fixes, resume under deterministic ops, benchmarks.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 RHNZOO_DATA="$PWD/.gpudata"
PY=$(command -v python || command -v python3)
$PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpudata/whl/*.whl && export PYTHONPATH="$PWD:/tmp/site"
{ date -u; echo "commit $(git rev-parse HEAD 2>/dev/null) + working tree"; nvidia-smi -L; $PY -c "import jax; print('jax', jax.__version__, jax.devices())"; } > "$OUT/env.txt" 2>&1; cat "$OUT/env.txt"
t0=$(date +%s)
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 $PY -m pytest -q -n 8 -p no:cacheprovider -rfE -m "not slow" tests/test_engine.py tests/test_fastmath.py tests/test_precision.py tests/test_lm_config.py tests/test_train.py 2>&1 | tail -c 40000 > "$OUT/pytest.log"
echo "tests in $(( $(date +%s) - t0 )) s"; grep -E "passed|failed" "$OUT/pytest.log" | tail -2; grep -E "^(FAILED|ERROR)" "$OUT/pytest.log"
t0=$(date +%s)
XLA_FLAGS=--xla_gpu_deterministic_ops=true timeout -k 5 60 $PY -m pytest -q -p no:cacheprovider -rfE "tests/test_train.py::test_interrupted_run_resumes_exactly" 2>&1 | tail -c 6000 > "$OUT/pytest_det.log"
echo "deterministic resume in $(( $(date +%s) - t0 )) s:"; tail -2 "$OUT/pytest_det.log"
t0=$(date +%s)
timeout -k 5 150 $PY -m rhnzoo.bench.rnn --configs=pmnist --cells=lstm,gru --unroll=4,8 --rounds=3 > "$OUT/rnn.jsonl" 2> "$OUT/rnn.log"
echo "rnn pmnist rc=$? in $(( $(date +%s) - t0 )) s"; grep -v "^[IW]1126" "$OUT/rnn.log" | tail -3
t0=$(date +%s)
timeout -k 5 90 $PY -m rhnzoo.bench.rnn --configs=imdb --cells=lstm --unroll=2,4 --rounds=3 >> "$OUT/rnn.jsonl" 2>> "$OUT/rnn.log"
echo "rnn imdb rc=$? in $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
for u in 1 5; do timeout -k 5 60 $PY -m rhnzoo.bench.lm --configs=ptb_d40_hsg --unroll=$u --budget_s=6 --eval_tokens=0 >> "$OUT/lm.jsonl" 2>> "$OUT/lm.log"; echo "lm d40 u=$u rc=$?"; done
echo "lm in $(( $(date +%s) - t0 )) s"
$PY - "$OUT" <<'PY'
import json, sys
for f in ("rnn.jsonl", "lm.jsonl"):
    try: lines = open(f"{sys.argv[1]}/{f}").read().splitlines()
    except OSError: continue
    for l in lines:
        r = json.loads(l); print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items() if "ms_min" in k or k in ("cell", "config", "unroll", "speedup", "seconds") or k.startswith("ratio")})
PY
