#!/usr/bin/env bash
# Third device call: bench.rnn at the IMDB shape (cuDNN check fixed), SC-LSTM / RRN at P-MNIST, XLA loop command buffers.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
PY=$(command -v python || command -v python3)
{ date -u; echo "commit $(git rev-parse HEAD 2>/dev/null) + working tree"; nvidia-smi -L; $PY -c "import jax; print('jax', jax.__version__, jax.devices())"; } > "$OUT/env.txt" 2>&1; cat "$OUT/env.txt"
B="$PY -m rhnzoo.bench.rnn"
t0=$(date +%s); timeout -k 5 60 $B --configs=imdb --cells=lstm,gru --unroll=2,4,8 --rounds=3 > "$OUT/rnn_imdb.jsonl" 2> "$OUT/rnn_imdb.log"; echo "imdb rc=$? $(( $(date +%s) - t0 )) s"
t0=$(date +%s); timeout -k 5 40 $B --configs=imdb --cells=lstm --matmul_precision=highest --rounds=1 > "$OUT/rnn_imdb_highest.jsonl" 2>> "$OUT/rnn_imdb.log"; echo "imdb highest rc=$? $(( $(date +%s) - t0 )) s"
t0=$(date +%s); timeout -k 5 60 $B --configs=pmnist --cells=sc_lstm,rrn --unroll=4,8 --rounds=3 > "$OUT/rnn_pmnist_sc_rrn.jsonl" 2> "$OUT/rnn_pmnist_sc_rrn.log"; echo "pmnist sc/rrn rc=$? $(( $(date +%s) - t0 )) s"
t0=$(date +%s); XLA_FLAGS="--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL" timeout -k 5 60 $B --configs=pmnist --cells=lstm,gru --unroll=8 --rounds=3 > "$OUT/rnn_cmdbuf.jsonl" 2> "$OUT/rnn_cmdbuf.log"; echo "cmdbuf rc=$? $(( $(date +%s) - t0 )) s"
grep -hv "^[IW]1126" "$OUT"/*.log | grep -E "Error|error" | head -5
$PY - "$OUT" <<'PY'
import json, sys, glob
for f in sorted(glob.glob(f"{sys.argv[1]}/*.jsonl")):
    for l in open(f):
        r = json.loads(l)
        print(f.split("/")[-1], r["cell"], r["config"], r["matmul_precision"], {k: round(v["min"] * 1e3, 2) for k, v in r["seconds"].items()}, {k: round(v, 4) for k, v in r["losses"].items()})
PY
