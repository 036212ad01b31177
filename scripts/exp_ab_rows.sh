#!/usr/bin/env bash
# Per-row tile A/B: one scripts/exp_ab_templates call per line of ROWS ("PROBLEM TILE [TILE ...]", e.g.
# "bf16:1050x2112x7168 88x192w 152x128w"), each forced tile a tree of the checkout's templates named t<TILE> beside
# the heuristic's pick ("new"), interleaved and checked bit for bit against each other before timing.
#   bash scripts/exp_ab_rows.sh ROWS OUTDIR [--offline]    (--offline: compile only, into DEEPGEMM_JIT_CACHE_DIR)
# One JSON per row under OUTDIR (row<N>.json). Lines starting with # are skipped.
set -uo pipefail
rows=$1; outdir=$2; shift 2
mkdir -p "$outdir"
n=0; rc=0
# One file for all rows (the device tool brings back few files): {"rows": [...every row's JSON rows...]}.
merge() {
python3 - "$outdir" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = [r for f in sorted(out.glob("row*/*.json")) for r in json.loads(f.read_text()).get("rows", [])]
if rows:
    (out / "rows.json").write_text(json.dumps({"rows": rows}, indent=1))
    for r in rows:
        times = {k: v["us"] for k, v in r.items() if isinstance(v, dict) and "us" in v}
        best = min(times, key=times.get)
        print(r["problem"], "bitwise" if r.get("bitwise_equal") else "NOT bitwise",
              " ".join(f"{k} {v:.1f}" for k, v in times.items()), "best", best)
PY
}
while read -r problem tiles; do
  case "$problem" in ''|'#'*) continue;; esac
  n=$((n + 1))
  trees=()
  for tile in $tiles; do trees+=(--tree "t$tile=.@$tile"); done
  python3 -m scripts.exp_ab_templates "${trees[@]}" --problems "$problem" --out "$outdir/row$n" "$@" \
    > "$outdir/row$n.log" 2>&1 || { rc=1; echo "row $n ($problem) failed: $outdir/row$n.log"; }
  tail -3 "$outdir/row$n.log"
  merge > /dev/null  # after every row: a call cut short by its time limit keeps the rows it finished
done < "$rows"
merge
exit $rc
