#!/usr/bin/env bash
# Download what the lent GPU machine lacks (benchmarks/gpu/carry.txt) as Python 3.12
# x86-64 wheels into .whl/ (ignored by git), to carry there; antlr4-python3-runtime
# has no wheel, so its source archive comes instead. Run where pip reaches PyPI.
set -euo pipefail
cd "$(dirname "$0")/../.."
exclude=$(git rev-parse --git-path info/exclude)  # .git may be a file (a worktree)
mkdir -p .whl "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
mapfile -t pins < <(grep -v '^#' benchmarks/gpu/carry.txt | grep -v '^antlr4' | sed '/^$/d')
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d .whl "${pins[@]}"
python3 -m pip download --quiet --no-deps --no-binary=:all: -d .whl \
    "$(grep '^antlr4' benchmarks/gpu/carry.txt)"
ls .whl
