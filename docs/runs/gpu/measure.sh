#!/usr/bin/env bash
# The GPU measurements of issues 31, 33 and 45, one part per device call (each < 10 min):
#
#   bash docs/runs/gpu/measure.sh suite   # the test suite on the GPU (issue 31 part 1)
#   bash docs/runs/gpu/measure.sh rnn     # bench.rnn: fused / reference / Flax / cuDNN, unroll k
#   bash docs/runs/gpu/measure.sh flags   # bench.rnn P-MNIST under XLA loop command buffers
#   bash docs/runs/gpu/measure.sh lm      # bench.lm ptb_sota / ptb_d40_hsg, unroll, bf16, trace
#   bash docs/runs/gpu/measure.sh pallas  # issue 45 part 3, < 8 min: the kernels timed alone
#                                         # (pallas_probe.py), the Pallas tests compiled on the
#                                         # GPU, then bench.rnn with the persistent kernel and
#                                         # PyTorch's cuDNN LSTM / GRU (fp32, TF32, bf16, fp16)
#                                         # at the P-MNIST and IMDB shapes, every gated cell, min
#                                         # of 3, and torch's kernels (profiler)
#   bash docs/runs/gpu/measure.sh pallas-quick  # the same in ~3 min for a second try in
#                                         # the same window: P-MNIST, LSTM, GRU, SC-LSTM, RRN, min of 2
#   bash docs/runs/gpu/measure.sh seeds   # issue 47, < 8 min: K seeds in one step (bench.seeds)
#   bash docs/runs/gpu/measure.sh seeds-quick   # its P-MNIST part, ~2 min
#
# Everything goes to $OUT (the device tool brings it back): JSONL per benchmark, logs,
# and env.txt (device, JAX version, commit, flags; torch's versions for pallas). Run from
# the repository root. The pallas parts write pallas-pytest.log, pallas.jsonl (one line
# per cell and shape, then one "torch_kernels" line per torch peer) and pallas.log; each
# step runs under a timeout within the part's budget, and the JSONL is written line by
# line, so a step cut short keeps what it finished. If the Pallas tests time out (a hung
# kernel), the benchmark runs without --pallas.
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
  pallas|pallas-quick)
    # LSTM, reset-after GRU, then the kernels no GPU has run yet: SC-LSTM-P (L = 20) and RRN
    # (issue 45's target: within 1.3x of the LSTM; no torch peer) and Cho's GRU
    # (rhnzoo.cells.chained_pallas). The new ones come last: a bench cut short keeps the
    # others.
    if [ "$1" = pallas ]; then
      end=$((SECONDS + 420)) t_test=180 t_probe=90 rounds=3 prof=--torch_profile
      configs=pmnist,imdb cells=lstm,gru_ra,sc_lstm,rrn,gru
    else
      end=$((SECONDS + 170)) t_test=90 t_probe=45 rounds=2 prof=
      configs=pmnist cells=lstm,gru_ra,sc_lstm,rrn
    fi
    # The kernels on their own (forward, backward, unroll, value_and_grad) beside the fused
    # scan in bfloat16: one JSON line per figure.
    timeout -k 5 "$t_probe" python docs/runs/gpu/pallas_probe.py > "$OUT/pallas-probe.jsonl" \
      2> "$OUT/pallas-probe.log"
    echo "pallas probe: rc=$?"; cut -c1-200 "$OUT/pallas-probe.jsonl"
    python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version(), 'gpu', torch.cuda.is_available())" >> "$OUT/env.txt" 2>&1
    pallas=--pallas
    if [ -f tests/test_gated_pallas.py ]; then
      t0=$SECONDS
      timeout -k 5 "$t_test" python -m pytest -q -p no:cacheprovider -rfE \
        tests/test_gated_pallas.py tests/test_chained_pallas.py > "$OUT/pallas-pytest.log" 2>&1
      rc=$?
      echo "pallas tests: rc=$rc in $((SECONDS - t0)) s"; tail -3 "$OUT/pallas-pytest.log"
      if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        pallas=; echo "pallas tests timed out: bench.rnn runs without --pallas"
      fi
    else
      echo "no tests/test_gated_pallas.py: no Pallas tests run" | tee "$OUT/pallas-pytest.log"
    fi
    t_bench=$((end - SECONDS)); [ $t_bench -ge 60 ] || t_bench=60
    t0=$SECONDS
    timeout -k 5 "$t_bench" python -m rhnzoo.bench.rnn --configs=$configs --cells=$cells \
      $pallas --torch $prof --bfloat16 --unroll=8 --rounds=$rounds \
      > "$OUT/pallas.jsonl" 2> "$OUT/pallas.log"
    echo "bench.rnn: rc=$? in $((SECONDS - t0)) s (limit $t_bench s)"
    grep -v "^[IW][0-9]\{4\} " "$OUT/pallas.log" | grep -E "Error|error" | head -5
    python - "$OUT/pallas.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("record") == "torch_kernels":
        ks = "; ".join(f"{k['name'][:60]} x{k['calls']} {k['ms']:.2f} ms"
                       for k in r.get("kernels", [])[:3])
        print(f"  kernels {r['cell']} {r['config']} {r['candidate']}: {ks or r.get('error')}")
        continue
    ms = {k: round(v["min"] * 1e3, 2) for k, v in r["seconds"].items()}
    print(f"{r['cell']} {r['config']} ({r['device']}, {r['matmul_precision']}) ms:", ms)
    ratio = {k[6:]: round(v["min"], 2) for k, v in r.items()
             if k.startswith("ratio_") and ("pallas" in k or "torch" in k)}
    if ratio:
        print("  ratios (min/min, > 1: the second is faster):", ratio)
    checks = r.get("loss_checks", {})
    bad = [k for k, v in checks.items() if not v["ok"]]
    if bad:
        print("  LOSS CHECK FAILED:", {k: r["losses"][k] for k in bad},
              "against", {k: r["losses"].get(checks[k]["against"]) for k in bad})
    for k, why in r.get("skipped", {}).items():
        if not (k.startswith("torch") and r["cell"] in ("sc_lstm", "rrn")):
            print(f"  skipped {k}: {why[:160]}")
PY
    ;;
  seeds|seeds-quick)
    # Issue 47: K seeds as a batch dimension of one train step (bench.seeds), K = 1, 2, 4, 8
    # at the P-MNIST and IMDB shapes and ptb_sota (seeds-quick: P-MNIST, K = 1, 4, ~2 min).
    if [ "$1" = seeds ]; then cfg=pmnist,imdb,ptb_sota ks=1,2,4,8 t=420
    else cfg=pmnist ks=1,4 t=150; fi
    timeout -k 5 "$t" python -m rhnzoo.bench.seeds --configs="$cfg" --seeds="$ks" --rounds=3 \
      > "$OUT/seeds.jsonl" 2> "$OUT/seeds.log"
    echo "seeds: rc=$?"
    python - "$OUT/seeds.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    ks = sorted(int(k[1:].split("_")[0]) for k in r if k.endswith("_ms_per_seed"))
    print(r["config"], r["device"], "single", round(r["single_step_ms_min"], 2), "ms;",
          {k: (round(r[f"k{k}_ms_per_seed"], 2), round(r[f"k{k}_steps_ratio"], 2)) for k in ks},
          "(ms per seed, K seeds' step / K steps)")
PY
    ;;
  *)
    echo "usage: bash docs/runs/gpu/measure.sh suite|rnn|flags|lm|pallas|pallas-quick|seeds|seeds-quick" >&2
    exit 2 ;;
esac
