#!/usr/bin/env bash
# On the lent GPU machine (carry .whl, made by benchmarks/gpu/wheels.sh): install the
# carried packages into /tmp/site and run the suite with this script's arguments, e.g.
#   bash benchmarks/gpu/lent.sh --minutes 7 --kernels --json "$OUT/gpu.json"
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12) and
    f"the carried wheels are for Python 3.12; this python3 is {sys.version.split()[0]}")'
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site \
    .whl/antlr4-python3-runtime-*.tar.gz
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec python3 -m benchmarks.gpu "$@"
