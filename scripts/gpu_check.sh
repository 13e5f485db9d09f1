#!/usr/bin/env bash
# The decoder's graph path on one lent GPU, in one go (scripts/gpu_check.py says what it checks):
#   scripts/gpu_check.sh <schedule.json> <out folder> [more gpu_check flags]
# Wheels under .whl/ (transformers of the version pyproject.toml admits, and what the project imports that the GPU
# image lacks) are installed into /tmp/site first, leaving the image's own packages as they are. Fetched here with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl \
#       transformers==5.24.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
# The schedule comes from held-out labels on the CPU (python -m evaluation.schedule). On an H100 the pair's part under
# graphs over eager layers ran in 107 s and the 7B shape's in about 50 s more; compiled layers add about 160 s of
# compiles and captures for the pair, so the whole check runs past 9 minutes: split it over calls with --skip_tiny,
# --skip_7b, --skip_compile (the bare compiled step) and --decoders (results.json is written after each part).
set -euo pipefail
cd "$(dirname "$0")/.."
schedule=${1:?usage: scripts/gpu_check.sh <schedule.json> <out folder> [flags]}
out=${2:?usage: scripts/gpu_check.sh <schedule.json> <out folder> [flags]}
shift 2
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore TOKENIZERS_PARALLELISM=false
python3 -m scripts.gpu_check --schedule "$schedule" --out "$out" "$@"
