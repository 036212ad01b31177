#!/usr/bin/env bash
# Here, before a device run: the wheels the GPU machine lacks (.whl) and the commit (.carry/commit).
# Both folders are git-ignored; name them in the device tool's `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl .carry
[ -n "$(ls .whl/platformdirs-*.whl 2>/dev/null)" ] || python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  -d .whl platformdirs
dirty=0  # tracked changes, or new files where the run can load code (bench.report.UNTRACKED_DIRTY)
untracked=$(git status --porcelain -- deepgemm_jit templates bench scripts ':(exclude)bench/results' | grep '^??' || true)
[ -z "$(git status --porcelain --untracked-files=no)$untracked" ] || dirty=1
# the source hash lets bench.report.git_info tell a stale file from the code it was written for
echo "$(git rev-parse HEAD) $dirty $(python3 -c 'from bench.report import source_sha256; print(source_sha256())')" \
  > .carry/commit
echo "prepared: $(ls .whl) commit $(cat .carry/commit)"
