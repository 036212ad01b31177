#!/usr/bin/env bash
# GPU machine: profile GEMM variants with Nsight Compute and export what a CPU can read back.
# Usage (repo root, carrying .whl and .carry): bash scripts/profile_ncu.sh [SHAPE] VARIANT...
#   SHAPE like 4096x7168x16384 (default); VARIANT from scripts/profile_ncu.py (gemv-* for the weight-streaming
#   kernel at M <= 8 / 16). LAYOUT=nn (tn, tt) in the environment stores the operands that way (default nt).
# Per variant: VARIANT-details.csv (sections), VARIANT-raw.csv (every metric), VARIANT-sass.csv (per-SASS-
# instruction samples and stall reasons), VARIANT.log; packed into $OUT/ncu.tgz (the device tool returns at
# most 8 files), the .ncu-rep reports into $OUT/ncu-reps.tgz.
set -uo pipefail
OUT=${OUT:-./device-out}; mkdir -p "$OUT"
WORK=/tmp/ncu-work; rm -rf "$WORK"; mkdir -p "$WORK"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export DEEPGEMM_JIT_CACHE_DIR=/tmp/dgjit-cache
shape=4096x7168x16384
case "${1:-}" in *x*x*) shape=$1; shift;; esac
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 4; }
for v in "$@"; do
  rep="$WORK/$(printf %s "$v" | tr "@:+" "___")"
  # Build (JIT compile) outside the profiler first so that ncu times only launches.
  args=(--variant "$v" --shape "$shape" --layout "${LAYOUT:-nt}")
  python3 -m scripts.profile_ncu "${args[@]}" --launches 1 > "$rep.log" 2>&1 || { cat "$rep.log"; continue; }
  kernels="dgjit_gem[mv]"; case "$v" in cublas-*) kernels="xmma|nvjet|cutlass|gemm";; esac
  "$NCU" --clock-control none --kernel-name regex:"$kernels" --launch-skip 2 --launch-count 1 --set full \
      --import-source no -f -o "$rep" python3 -m scripts.profile_ncu "${args[@]}" >> "$rep.log" 2>&1
  "$NCU" -i "$rep.ncu-rep" --page details --csv > "$rep-details.csv" 2>> "$rep.log"
  "$NCU" -i "$rep.ncu-rep" --page raw --csv > "$rep-raw.csv" 2>> "$rep.log"
  "$NCU" -i "$rep.ncu-rep" --page source --print-source sass --csv > "$rep-sass.csv" 2>> "$rep.log"
  tail -3 "$rep.log"; wc -c "$rep-details.csv" "$rep-sass.csv"
done
tar czf "$OUT/ncu.tgz" -C "$WORK" --exclude="*.ncu-rep" .
tar czf "$OUT/ncu-reps.tgz" -C "$WORK" $(cd "$WORK" && ls -- *.ncu-rep)
ls -la "$OUT"
