#!/usr/bin/env bash
# Fourth device call: the fast suite on the GPU with this session's changes (unroll 8 default on GPU included).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 RHNZOO_DATA="$PWD/.gpudata" XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=$(command -v python || command -v python3)
$PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpudata/whl/*.whl && export PYTHONPATH="$PWD:/tmp/site"
{ date -u; echo "commit $(git rev-parse HEAD 2>/dev/null) + working tree"; git diff --stat | tail -1; nvidia-smi -L; $PY -c "import jax; print('jax', jax.__version__, jax.devices())"; } > "$OUT/env.txt" 2>&1; cat "$OUT/env.txt"
t0=$(date +%s)
timeout -k 5 200 $PY -m pytest -q -n 12 -m "not slow" -p no:cacheprovider -rfEs 2>&1 | tail -c 60000 > "$OUT/pytest.log"
echo "suite in $(( $(date +%s) - t0 )) s"; grep -E "passed|failed" "$OUT/pytest.log" | tail -2; grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/pytest.log" | head -30
