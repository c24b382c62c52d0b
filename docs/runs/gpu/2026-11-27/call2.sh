#!/usr/bin/env bash
# Call 2 (issue 45): the forward kernel with one warpgroup per 64 hidden units and the
# bias read from shared memory each step (call 1: one warpgroup, bias tiles held in
# registers), tanh.approx A/B; the Pallas tests compiled; bench.rnn P-MNIST LSTM.
set -uo pipefail
OUT="${OUT:-/tmp/rhnzoo-gpu-out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi -L; python -c "import jax; print('jax', jax.__version__, jax.devices())"; } > "$OUT/env.txt" 2>&1
timeout -k 5 130 python docs/runs/gpu/pallas_probe.py > "$OUT/pallas-probe.jsonl" 2> "$OUT/pallas-probe.log"
echo "probe rc=$?"; cut -c1-160 "$OUT/pallas-probe.jsonl"
timeout -k 5 100 python -m pytest -q -p no:cacheprovider -rfE tests/test_gated_pallas.py > "$OUT/pallas-pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$OUT/pallas-pytest.log"
timeout -k 5 100 python -m rhnzoo.bench.rnn --configs=pmnist --cells=lstm --pallas --torch --bfloat16 \
  --rounds=3 > "$OUT/pallas.jsonl" 2> "$OUT/pallas.log"
echo "bench rc=$?"
python - "$OUT/pallas.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["cell"], r["config"], {k: round(v["min"] * 1e3, 2) for k, v in r["seconds"].items()})
PY
