#!/usr/bin/env bash
# Host-code A/B on the GPU machine: the same benchmark module run under the checkout ("new") and under other
# source trees (a heuristic or launcher change, templates included), alternated for ROUNDS rounds in one call.
#   bash scripts/exp_ab_source.sh OUTDIR ROUNDS NAME=TREE [NAME=TREE ...] -- MODULE ARGS...
# TREE holds deepgemm_jit/, templates/ and bench/ of another commit, e.g. here
#   mkdir -p .carry/old && git archive HEAD deepgemm_jit templates bench scripts | tar -x -C .carry/old
#   rm -rf .carry/old/bench/results
# Each run is `python3 -m MODULE ARGS --out OUTDIR/<name><round>` started inside its tree (python -m puts the
# working directory first on sys.path), its output in OUTDIR/<name><round>.log. Precompile both trees' kernels
# here (deepgemm-jit warmup, run inside each tree) into the carried cache: NVRTC on the GPU machine costs seconds
# per kernel. Compare only numbers from one call.
set -uo pipefail
outdir=$(realpath -m "$1"); rounds=$2; shift 2
names=(new); trees=("$PWD")
while [ $# -gt 0 ] && [ "$1" != "--" ]; do names+=("${1%%=*}"); trees+=("$(realpath "${1#*=}")"); shift; done
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "usage: $0 OUTDIR ROUNDS NAME=TREE ... -- MODULE ARGS..." >&2; exit 2; }
mkdir -p "$outdir"
rc=0
for r in $(seq 1 "$rounds"); do
  for i in "${!names[@]}"; do
    name=${names[$i]}$r
    (cd "${trees[$i]}" && python3 -m "$@" --out "$outdir/$name") > "$outdir/$name.log" 2>&1
    status=$?
    [ $status -eq 0 ] || rc=1
    echo "== $name rc $status: $(tail -1 "$outdir/$name.log")"
  done
done
exit $rc
