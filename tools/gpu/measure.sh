#!/usr/bin/env bash
# The GPU measurements (issues 31, 33, 45, 47, 57), one part per device call (each < 10 min):
#
#   bash tools/gpu/measure.sh [--dry] PART
#
#   suite         the fast test suite on the GPU, 8 xdist workers, preallocation off
#   rnn           bench.rnn: fused / reference / Flax / cuDNN, unroll k
#   flags         bench.rnn P-MNIST under XLA loop command buffers
#   lm            bench.lm ptb_sota / ptb_d40_hsg per candidate (f32, TF32, bf16 matmul
#                 inputs, unroll 5, the RHN micro-layer kernel: --scan_impl=pallas, issue
#                 60) against the plain-JAX peer in the same process; then
#                 the depth-40 step's XLA op table (lm_ops.py: weight-slice copies?)
#   pallas        issue 45: bench.rnn with the persistent kernels and PyTorch's cuDNN peers
#                 (fp32, TF32, bf16, fp16) at P-MNIST and IMDB, every gated cell, and torch's
#                 kernels (profiler); then the kernels alone (pallas_probe.py); then the
#                 Pallas tests compiled on the GPU
#   pallas-quick  the same in ~5 min: P-MNIST, LSTM, GRU, SC-LSTM, RRN, min of 2
#   seeds         issue 47: K seeds in one step (bench.seeds); seeds-quick: P-MNIST, ~2 min
#   kernels       issue 68: the kernel window, ~8.3 min, ordered by what it tells, each
#                 section under its own timeout: (a) the P-MNIST LSTM (1 -> 100, B 100,
#                 T 784): forward and value_and_grad of the default kernels, swap-AB at
#                 batch tiles 16 / 32 and the fused bf16 scan, then the error of each
#                 variant (default, approx_math, barrier elision, Bt 16 / 32, fused)
#                 against the float32 reference (kernel_probe.py); (b) the device's own
#                 ptxas counts beside docs/runs/kernels/ (kernel_ptxas.py); (c) the
#                 compiled correctness tests ordered by risk (kernel_order.py, -v); (d) the
#                 RHN kernels at ptb_sota and depth 40 + HSG beside the fused bf16 scan
#                 (kernel_probe.py --rhn). Its *.jsonl lines carry backend, cell, sizes,
#                 dtype, options, digest and device kind: `python -m
#                 tools.kernel_record $OUT` makes them record entries
#
# Each part runs its benchmark first, then its tests, each step under its own timeout
# (a timeout in the tests never loses the benchmark), and leaves at most 8 files in $OUT
# (the device tool brings back 8): env.txt, then the part's JSONL / logs. Scratch (dumps,
# compiler output) goes to a folder outside $OUT. --dry: the same part on this CPU at tiny
# shapes (JAX_PLATFORMS=cpu, the same timeouts, the same $OUT rules; the tests only
# collected; no Pallas kernel: the probes time the float32 fused scan in its place), as
# tests/test_device_simulation.py runs it. Run from the repository root.
set -uo pipefail
dry=
if [ "${1:-}" = --dry ]; then dry=1; shift; fi
part="${1:-}"
case "$part" in
  suite|rnn|flags|lm|pallas|pallas-quick|seeds|seeds-quick|kernels) ;;
  *) echo "error: usage: bash tools/gpu/measure.sh [--dry] suite|rnn|flags|lm|pallas|pallas-quick|seeds|seeds-quick|kernels" >&2
     exit 1 ;;
esac
OUT="${OUT:-/tmp/rhnzoo-gpu-out}"
mkdir -p "$OUT"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/rhnzoo-measure.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -n "$dry" ] && export JAX_PLATFORMS=cpu
[ "$part" = suite ] && export XLA_PYTHON_CLIENT_PREALLOCATE=false  # 8 workers, one GPU
{
  date -u; echo "part: $part${dry:+ (dry)}"
  git rev-parse HEAD 2>/dev/null || echo "${RHNZOO_COMMIT:-commit: (no git)}"  # the call may name it
  nvidia-smi -L 2>/dev/null || echo "nvidia-smi: none"
  python -c "import jax, jaxlib; print('jax', jax.__version__, jax.devices())"
  echo "XLA_FLAGS=${XLA_FLAGS:-}"
  echo "XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-}"
} > "$OUT/env.txt" 2>&1

# step NAME LIMIT_S COMMAND...: COMMAND under `timeout LIMIT_S`; one line with its status
# on the script's stdout (fd 3), whatever the call redirects.
exec 3>&1
step() {
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  timeout -k 5 "$limit" "$@"
  rc=$?
  echo "$name: rc=$rc in $((SECONDS - t0)) s (limit $limit s)$([ $rc -eq 124 ] || [ $rc -eq 137 ] && echo ', timed out')" >&3
  return 0
}

# Prints bench.rnn's JSONL ($1) as one line per cell and shape (ms, ratios, failed checks).
rnn_summary() {
  python - "$1" <<'PY'
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
    if "seconds" not in r:
        continue
    ms = {k: round(v["min"] * 1e3, 2) for k, v in r["seconds"].items()}
    print(f"{r['cell']} {r['config']} ({r['device']}, {r['matmul_precision']}) ms:", ms)
    ratio = {k[6:]: round(v["min"], 2) for k, v in r.items()
             if k.startswith("ratio_") and ("pallas" in k or "torch" in k)}
    if ratio:
        print("  ratios (min/min, > 1: the second is faster):", ratio)
    bad = [k for k, v in r.get("loss_checks", {}).items() if not v["ok"]]
    if bad:
        print("  LOSS CHECK FAILED:", bad)
PY
}

case "$part" in
  suite)
    if [ -n "$dry" ]; then sel=(-p no:xdist tests/test_layers.py); else sel=(-n 8); fi
    step tests 560 python -m pytest -q -m "not slow" -p no:cacheprovider "${sel[@]}" \
      > "$OUT/pytest.log" 2>&1
    tail -40 "$OUT/pytest.log" ;;
  rnn)
    if [ -n "$dry" ]; then a=(--configs=tiny --cells=lstm --unroll=2 --rounds=1)
    else a=(--configs=pmnist,imdb --cells=lstm,gru,sc_lstm,rrn --unroll=2,4,8 --bfloat16 --rounds=5); fi
    step bench 560 python -m rhnzoo.bench.rnn "${a[@]}" > "$OUT/rnn.jsonl" 2> "$OUT/rnn.log"
    rnn_summary "$OUT/rnn.jsonl" ;;
  flags)
    if [ -n "$dry" ]; then
      # a CPU flag, then one XLA refuses: its error must land in the log
      fl=("--xla_backend_optimization_level=2" "--xla_no_such_flag_in_a_dry_run=1")
      a=(--configs=tiny --cells=lstm --unroll=2 --rounds=1)
    else
      fl=("--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
          "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1")
      a=(--configs=pmnist --cells=lstm,gru --unroll=4 --rounds=5)
    fi
    for f in "${fl[@]}"; do
      # python's stderr to the log (not sed's), its JSON lines tagged with the flags
      XLA_FLAGS="$f" timeout -k 5 250 python -m rhnzoo.bench.rnn "${a[@]}" 2>> "$OUT/rnn_flags.log" \
        | sed "s|^{|{\"xla_flags\": \"$f\", |" >> "$OUT/rnn_flags.jsonl"
      echo "bench ($f): rc=${PIPESTATUS[0]}"
    done
    rnn_summary "$OUT/rnn_flags.jsonl" ;;
  lm)
    # f32 (highest), TF32 (the backend's default), bf16 matmul inputs, unroll 5, the fused
    # micro-layer kernel (bf16); the plain-JAX peer alternates with rhnzoo's step in each
    # process (dry: the first and the kernel, interpreted).
    kern="--dtype=bfloat16 --scan_impl=pallas"
    cands=("--matmul_precision=highest" "--matmul_precision=default" "--dtype=bfloat16" "--unroll=5" "$kern")
    if [ -n "$dry" ]; then cfg=tiny b=(--budget_s=1 --steps=1 --eval_tokens=0) cands=("${cands[0]}" "$kern")
    else cfg=ptb_sota,ptb_d40_hsg b=(--budget_s=15 --eval_tokens=0); fi
    for c in "${cands[@]}"; do
      step "bench $c" 90 python -m rhnzoo.bench.lm --configs=$cfg --peer $c "${b[@]}" \
        >> "$OUT/lm.jsonl" 2>> "$OUT/lm.log"
    done
    [ -n "$dry" ] && ops=tiny || ops=ptb_d40_hsg
    step "op table" 100 python tools/gpu/lm_ops.py --config=$ops > "$OUT/lm-ops.txt" 2>&1
    python - "$OUT/lm.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    print(r.get("config"), r.get("scan_impl"), r.get("dtype"), r.get("matmul_precision"), "unroll", r.get("unroll"),
          {k: v for k, v in r.items() if k.endswith("_ms") or k.startswith("ratio")})
PY
    head -30 "$OUT/lm-ops.txt" ;;
  pallas|pallas-quick)
    # LSTM, reset-after GRU, then the kernels no GPU has run yet: SC-LSTM-P (L = 20) and RRN
    # (issue 45's target: within 1.3x of the LSTM; no torch peer) and Cho's GRU
    # (rhnzoo.cells.chained_pallas). The new ones come last: a bench cut short keeps the
    # others (its JSONL is written line by line).
    if [ "$part" = pallas ]; then
      t_bench=240 t_probe=60 t_test=200 rounds=3 prof=--torch_profile quick=
      configs=pmnist,imdb cells=lstm,gru_ra,sc_lstm,rrn,gru
    else
      t_bench=120 t_probe=45 t_test=150 rounds=2 prof= quick=--quick
      configs=pmnist cells=lstm,gru_ra,sc_lstm,rrn
    fi
    tdev=() pallas=--pallas
    if [ -n "$dry" ]; then configs=tiny cells=lstm rounds=1 tdev=(--torch_device=cpu) pallas=; fi
    python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version(), 'gpu', torch.cuda.is_available())" >> "$OUT/env.txt" 2>&1
    step bench "$t_bench" python -m rhnzoo.bench.rnn --configs=$configs --cells=$cells $pallas \
      --torch "${tdev[@]}" $prof --bfloat16 --unroll=8 --rounds=$rounds \
      > "$OUT/pallas.jsonl" 2> "$OUT/pallas.log"
    rnn_summary "$OUT/pallas.jsonl"
    # The kernels on their own (forward, backward, unroll, value_and_grad) beside the fused
    # scan in bfloat16: one JSON line per figure.
    if [ -n "$dry" ]; then
      step probe "$t_probe" python tools/gpu/kernel_probe.py --n=8 --batch=4 --length=2 \
        --stand_in --reps=1 > "$OUT/pallas-probe.jsonl" 2> "$OUT/pallas-probe.log"
    else
      step probe "$t_probe" python tools/gpu/pallas_probe.py $quick \
        > "$OUT/pallas-probe.jsonl" 2> "$OUT/pallas-probe.log"
    fi
    cut -c1-200 "$OUT/pallas-probe.jsonl"
    [ -n "$dry" ] && co=(--co) || co=()
    step tests "$t_test" python -m pytest -q -p no:cacheprovider -rfE "${co[@]}" \
      tests/test_gated_pallas.py tests/test_chained_pallas.py tests/test_swap_ab.py \
      > "$OUT/pallas-pytest.log" 2>&1
    tail -3 "$OUT/pallas-pytest.log" ;;
  seeds|seeds-quick)
    # Issue 47: K seeds as a batch dimension of one train step (bench.seeds), K = 1, 2, 4, 8
    # at the P-MNIST and IMDB shapes and ptb_sota (seeds-quick: P-MNIST, K = 1, 4, ~2 min).
    if [ "$part" = seeds ]; then cfg=pmnist,imdb,ptb_sota ks=1,2,4,8 t=420 r=3
    else cfg=pmnist ks=1,4 t=150 r=3; fi
    [ -n "$dry" ] && cfg=tiny_classifier ks=1,2 r=1
    step bench "$t" python -m rhnzoo.bench.seeds --configs="$cfg" --seeds="$ks" --rounds=$r \
      > "$OUT/seeds.jsonl" 2> "$OUT/seeds.log"
    python - "$OUT/seeds.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    ks = sorted(int(k[1:].split("_")[0]) for k in r if k.endswith("_ms_per_seed"))
    print(r["config"], r["device"], "single", round(r["single_step_ms_min"], 2), "ms;",
          {k: (round(r[f"k{k}_ms_per_seed"], 2), round(r[f"k{k}_steps_ratio"], 2)) for k in ks},
          "(ms per seed, K seeds' step / K steps)")
PY
    ;;
  kernels)
    # Issue 68 item 3: the kernel window, each section under its own timeout (a slow one
    # cannot eat the rest; the sum with start-up stays under 8.5 min), every figure
    # written as it comes (a cut keeps what ran). Dry: tiny shapes, the float32 fused
    # scan in the kernels' place (kernel_probe.py --stand_in: lines marked stand_in, which
    # never verify anything), the kernels lowered for cuda (kernel_ptxas.py --dry), the
    # tests collected in their order.
    if [ -n "$dry" ]; then
      lstm=(--n=8 --batch=4 --length=2 --stand_in --reps=1)
      rhn=(--rhn_n=8 --rhn_batch=4 --rhn_length=2 --stand_in --reps=1)
      ptx=(--dry --configs=lstm_n64,rhn_hsg_bt16) co=(--co -qq)  # -v -qq: node ids, in order
    else
      lstm=() rhn=() ptx=(--deadline_s=60) co=()
    fi
    kernel_summary() {
      python - "$@" <<'PY'
import json, sys
for path in sys.argv[1:]:
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        err = ""
        if "grad_rel_err" in r:
            err = f" loss err {r['loss_rel_err']:.2e}, worst grad err {max(r['grad_rel_err'].values()):.2e}"
        what = r.get("error", f"{r.get('ms')} ms (compile {r.get('compile_s')} s){err}")
        print(f"{r['cell']} n={r['n']} L={r['depth']} B={r['B']} T={r['T']} {r['figure']}: {what}"[:240])
PY
    }
    # (a) P-MNIST: default kernels, swap-AB Bt 16 / 32, fused bf16; then the variants' errors
    step "(a) P-MNIST kernels" 120 python tools/gpu/kernel_probe.py "${lstm[@]}" --variants \
      > "$OUT/kernels.jsonl" 2> "$OUT/kernels.log"
    kernel_summary "$OUT/kernels.jsonl"
    # (b) ptxas on the device, beside docs/runs/kernels/
    step "(b) ptxas" 90 python tools/gpu/kernel_ptxas.py "${ptx[@]}" \
      > "$OUT/kernels-ptxas.txt" 2>&1
    grep -E "^# |differs" "$OUT/kernels-ptxas.txt" | head -12
    # (c) the compiled correctness tests, riskiest first; -u: a cut keeps every name so far
    step "(c) tests" 170 env PYTHONPATH="$PWD/tools/gpu:$PYTHONPATH" python -u -m pytest -v \
      -p no:cacheprovider -p kernel_order -o console_output_style=times -rfE "${co[@]}" \
      tests/test_swap_ab.py tests/test_rhn_pallas.py tests/test_gated_pallas.py \
      tests/test_chained_pallas.py > "$OUT/kernels-pytest.log" 2>&1
    grep -cE " PASSED" "$OUT/kernels-pytest.log" | sed 's/^/passed: /'
    grep -E " (FAILED|ERROR)" "$OUT/kernels-pytest.log" | head -10
    tail -2 "$OUT/kernels-pytest.log"
    # (d) the RHN kernels at ptb_sota and depth 40 + HSG beside the fused bf16 scan
    step "(d) RHN kernels" 100 python tools/gpu/kernel_probe.py --no_lstm \
      --rhn=ptb_sota,ptb_d40_hsg "${rhn[@]}" > "$OUT/kernels-rhn.jsonl" 2>> "$OUT/kernels.log"
    kernel_summary "$OUT/kernels-rhn.jsonl"
    # what the record would take from this window (nothing is written here)
    python -m tools.kernel_record "$OUT" --dry 2>&1 | python -c "
import json, sys
text = sys.stdin.read()
try:
    entries = json.loads(text)
except ValueError:
    print('record:', text[-500:]); sys.exit()
for e in entries:
    print('entry', e['backend'], e['cell'], e['hidden_size'], e['batch'], e['options'],
          e['kernel_ms'], 'vs fused', e['fused_ms'], 'errors', e['value_error'], e['grad_error'],
          'stand_in' if e['stand_in'] else '')
print(len(entries), 'entries')" ;;
esac
