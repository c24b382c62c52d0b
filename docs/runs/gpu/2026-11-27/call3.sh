#!/usr/bin/env bash
# Call 3 (issue 45): the backward kernel with its per-phase inputs double-buffered where
# shared memory allows (n = 100 without output cotangents: the classifier's case); the
# probe's --quick figures only (the last 4 minutes of the session's device time).
set -uo pipefail
OUT="${OUT:-/tmp/rhnzoo-gpu-out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi -L; } > "$OUT/env.txt" 2>&1
timeout -k 5 100 python docs/runs/gpu/pallas_probe.py --quick > "$OUT/pallas-probe.jsonl" 2> "$OUT/pallas-probe.log"
echo "probe rc=$?"; cut -c1-130 "$OUT/pallas-probe.jsonl"
