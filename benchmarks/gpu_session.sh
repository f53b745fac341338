#!/usr/bin/env bash
# The GPU session in one command, for the lent machine (docs/gpu.md): what the machine has, the wheels its
# image lacks, the quick measurements of benchmarks/gpu_speed.py, the configuration they choose, then 000's whole
# Fashion-MNIST experiment (3 algorithms × 1000 rounds) under a hard limit. Everything lands in $OUT as it comes:
#
#   log.txt              all output            gpu.jsonl               every measurement, a JSON line each
#   results.tar.gz       <algorithm>.json/.csv of the full run (what docs/results/ and `dfl-node plot` take)
#   fmnist_cnn_zeta4.png its figure
#
# On the device (from the repository root; .whl from benchmarks/gpu_wheels.sh and .data/fashion_mnist.npz
# carried, both git-ignored):
#   bash benchmarks/gpu_session.sh
# Here, every step on the CPU at tiny sizes (digits, 3 rounds), in a minute or two:
#   DFL_GPU_SMOKE=1 OUT=/tmp/gpu-out bash benchmarks/gpu_session.sh
#
# Each section of gpu_speed.py runs in a process of its own under a limit of its own. Knobs (environment):
# DFL_GPU_BUDGET_S (540: the whole script's seconds; the full run gets what the rest left), DFL_GPU_QUICK_S (170:
# the quick sections' limit), DFL_GPU_QUICK_ROUNDS (10), DFL_GPU_SECTIONS (env,step,overhead,rounds,concurrent:
# before the full run), DFL_GPU_AFTER (precision: after it, in the time left),
# DFL_GPU_FULL (auto | streams | processes | sequential), DFL_GPU_FULL_ROUNDS (the experiment's 1000),
# DFL_GPU_WHEELS (.whl: the folder of wheels to install; none there, none installed).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
OUT=${OUT:?OUT must name the folder for the results}
mkdir -p "$OUT"
SMOKE=${DFL_GPU_SMOKE:-0}
BUDGET=${DFL_GPU_BUDGET_S:-540}
QUICK_S=${DFL_GPU_QUICK_S:-170}
ROUNDS=${DFL_GPU_QUICK_ROUNDS:-10}
SECTIONS=${DFL_GPU_SECTIONS:-env,step,overhead,rounds,concurrent}
AFTER=${DFL_GPU_AFTER:-precision}
FULL=${DFL_GPU_FULL:-auto}
WHEELS=${DFL_GPU_WHEELS:-.whl}
RESULTS=/tmp/dfl-gpu-results-$$
export PYTHONUNBUFFERED=1

say() { echo "[$(( $(date +%s) - START )) s] $*"; }
fail() { say "FAILED: $*"; exit 3; }

session() {
  say "== the machine"
  nvidia-smi || say "(no nvidia-smi here)"
  command -v python3 && python3 --version
  # importlib.metadata, not `pip show`: the same names and versions in 0.1 s instead of pip's 15 s of start-up
  python3 - <<'PY'
from importlib.metadata import PackageNotFoundError, version
for name in ("torch", "numpy", "grpcio", "protobuf", "pydantic", "click", "rich", "pyyaml", "safetensors",
             "matplotlib"):
    try:
        print(f"  {name} {version(name)}")
    except PackageNotFoundError:
        print(f"  {name}: not found")
PY

  say "== packages the image lacks ($WHEELS)"
  if compgen -G "$WHEELS/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$WHEELS"/*.whl || fail "installing $WHEELS/*.whl"
    export PYTHONPATH="/tmp/site:$PWD"
  else
    say "no wheels in $WHEELS: using what is installed"
    export PYTHONPATH="$PWD"
  fi

  say "== torch"
  # Whether torch has CUDA and whether dfl_node imports, in one interpreter (each start imports torch: seconds).
  # Its exit code: 1 added for no CUDA (or no torch), 2 for a dfl_node that does not import.
  local imports="import dfl_node.sim.experiment, dfl_node.cli.simulate, dfl_node.sweep.threads, \
dfl_node.learning.cuda_graphs"
  python3 -c "import sys, traceback
try:
    import torch
except ImportError:
    traceback.print_exc()
    sys.exit(3)
cuda = torch.cuda.is_available()
print('torch', torch.__version__, 'CUDA build', torch.version.cuda, 'available', cuda)
try:
    $imports
except Exception:
    traceback.print_exc()
    sys.exit((0 if cuda else 1) + 2)
sys.exit(0 if cuda else 1)"
  local checked=$?
  if (( checked & 1 )); then
    if [ "$SMOKE" = 1 ]; then
      say "no CUDA: smoke run on the CPU"
    else
      say "torch cannot use CUDA here: trying pip install torch==2.13.0 (needs a registry)"
      python3 -m pip install -q torch==2.13.0 && python3 -c "import torch; assert torch.cuda.is_available()" \
        || fail "no torch with CUDA on this machine, and none could be installed"
      if python3 -c "$imports"; then checked=0; else checked=2; fi  # with the torch installed now
    fi
  fi
  (( checked & 2 )) && fail "dfl_node does not import (a missing wheel?)"

  local device=cuda smoke=() data=()
  if [ "$SMOKE" = 1 ]; then
    device=cpu smoke=(--smoke)
  else
    [ -f .data/fashion_mnist.npz ] || fail ".data/fashion_mnist.npz is missing (carry .data)"
    data=(--data-dir "$PWD/.data")
  fi
  local speed=(python3 benchmarks/gpu_speed.py --device "$device" "${smoke[@]}" "${data[@]}" --out "$OUT/gpu.jsonl")

  # A process and a limit per section: a crash (a CUDA error poisons its process) or a hang costs that section only.
  section() {  # NAME CAP END: at most CAP seconds, and not past END
    local cap=$(( $3 - $(date +%s) ))
    (( cap > $2 )) && cap=$2
    if (( cap < 10 )); then say "$1: skipped, no time left"; return; fi
    timeout -k 5 "$cap" "${speed[@]}" --sections "$1" --rounds "$ROUNDS"
    say "$1: exit code $? (124: cut at $cap s; what it measured is in gpu.jsonl)"
  }
  declare -A caps=([env]=40 [step]=60 [overhead]=50 [rounds]=80 [concurrent]=60 [precision]=45)
  say "== quick measurements (at most $QUICK_S s): $SECTIONS"
  local quick_end=$(( $(date +%s) + QUICK_S ))
  for name in ${SECTIONS//,/ }; do section "$name" "${caps[$name]:-60}" "$quick_end"; done

  local left=$(( BUDGET - ($(date +%s) - START) - 25 ))
  say "== the full experiment ($FULL), at most $left s; then $AFTER with what is left"
  (( left > 30 )) || fail "no time left for the full run"
  local rounds=()
  [ -n "${DFL_GPU_FULL_ROUNDS:-}" ] && rounds=(--full-rounds "$DFL_GPU_FULL_ROUNDS")
  # the card's load meanwhile, every 15 s, into the log afterwards
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 15 > "$RESULTS.smi" 2>&1 &
  local smi=$!
  "${speed[@]}" --sections none --full "$FULL" "${rounds[@]}" --deadline "$left" --results "$RESULTS"
  say "full run ended with exit code $?"
  kill "$smi" 2>/dev/null
  sed 's/^/[nvidia-smi during the full run] /' "$RESULTS.smi" 2>/dev/null

  for name in ${AFTER//,/ }; do section "$name" "${caps[$name]:-60}" "$(( START + BUDGET - 15 ))"; done

  if compgen -G "$RESULTS/*.json" > /dev/null; then
    python3 -m dfl_node plot "$RESULTS"/*.json -o "$OUT/fmnist_cnn_zeta4.png" || say "the plot failed"
    tar czf "$OUT/results.tar.gz" -C "$RESULTS" . || say "packing the results failed"
  else
    say "no results were written"
  fi
  nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv 2>/dev/null
  say "== summary"
  grep -E '"section": "(graphs_equal_eager|accuracy|concurrent|choice)"|"event": "end"' "$OUT/gpu.jsonl" || true
  say "done: $(ls "$OUT" | tr '\n' ' ')"
}

session 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
