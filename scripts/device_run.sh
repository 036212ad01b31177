#!/usr/bin/env bash
# One call on the GPU machine: environment, GPU tests, demo, and optional extras.
# Usage (from the repo root, through the device tool, carrying .whl):
#   bash scripts/prepare_device.sh        # here: wheels + commit into ignored folders
#   bash scripts/device_run.sh [tests] [alltests] [demo] [gpu PYTEST_ARGS... --] [bench ARGS... --] [py MODULE ARGS... --]
# `gpu` runs only the GPU tests named by its arguments (files, -k, -x ...); `py` runs `python3 -m MODULE ARGS`
# (e.g. py bench.quant_epilogue --out $OUT/qe); each takes the arguments up to the next `--`.
# Tile sweeps: bench --tiles auto,128x256,128x192s4; kernel experiments: DEEPGEMM_JIT_TEMPLATES_DIR=<copy>.
# Writes logs and JSON under $OUT (or ./device-out when OUT is unset).
set -uo pipefail
OUT=${OUT:-./device-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export DEEPGEMM_JIT_CACHE_DIR=/tmp/dgjit-cache
# The copy on the GPU machine has no .git: the commit travels in .carry/commit (written by
# scripts/prepare_device.sh here), which bench.report.git_info reads itself, trusting it only while the code hashes
# as it did when the file was written. (Exporting its fields here read "1 <hash>" as the dirty flag: clean.)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/env.txt"
python3 -c "import cupy, torch, sys; print('python', sys.version.split()[0], 'cupy', cupy.__version__, 'torch', torch.__version__)" | tee -a "$OUT/env.txt"
rc=0
# Commands run in order; `gpu`, `bench` and `py` take the arguments up to the next `--` (or the end).
take_args() { ARGS=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do ARGS+=("$1"); shift; done; }
while [ $# -gt 0 ]; do
  cmd=$1; shift
  take_args "$@"; shift ${#ARGS[@]}; [ "${1:-}" = "--" ] && shift
  case "$cmd" in
    tests) python3 -m pytest -q -m "gpu or torch" tests bench -x -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -25; rc=$((rc | $?));;
    alltests) python3 -m pytest -q tests -p no:cacheprovider 2>&1 | tee "$OUT/all_tests.log" | tail -25; rc=$((rc | $?));;
    demo) python3 -m deepgemm_jit demo 2>&1 | tee "$OUT/demo.log"; rc=$((rc | $?));;
    gpu) python3 -m pytest -q -m "gpu or torch" -p no:cacheprovider "${ARGS[@]}" 2>&1 | tee "$OUT/gpu_subset.log" | tail -40; rc=$((rc | $?));;
    bench) python3 -m bench "${ARGS[@]}" 2>&1 | tee "$OUT/bench.log" | tail -40;;
    py) mod=${ARGS[0]}; python3 -m "${ARGS[@]}" 2>&1 | tee "$OUT/${mod//./_}.log" | tail -40;;
    *) echo "unknown command $cmd"; rc=2;;
  esac
done
exit $rc
