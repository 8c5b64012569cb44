#!/usr/bin/env bash
# The GPU check (issue 30) in one call: equality of the fused and spec encoders on the device, CUDA graphs
# against eager steps and eager predict, CUDA against CPU labels, exact resume, speed (PI 300D), labelling
# of 100,000 raw pairs and nccl under torchrun; a table last, full JSON under $OUT (else gpu-check/).
# What each part does and how it is sized: scripts/gpu_check.py.
#
#   scripts/gpu_check.sh --prepare      # once, where pip's registry is reachable: Python 3.12 wheels into .whl/,
#                                       # the SNLI dev and test files into .gpu-data/ (both git-excluded)
#   scripts/gpu_check.sh --dry-run      # every part at the smallest size on the CPU (under 2 minutes on 2 cores)
#   scripts/gpu_check.sh                # on the GPU machine; the device call of a session:
#       run(command="scripts/gpu_check.sh", carry=[".whl", ".gpu-data"], timeout_s=480)
#   scripts/gpu_check.sh --only checkpoint,label   # some parts only (a second, shorter call)
#
# The GPU image has Python 3.12 with torch (CUDA), numpy, pyarrow and pytest, and no spinn install: the
# checkout goes on PYTHONPATH, and when pydantic is missing the carried wheels are installed into /tmp/site.
set -euo pipefail
cd "$(dirname "$0")/.."

# README's commands need no activated venv: the project's .venv when there is one, else (the GPU image) python3.
default_python=python3
[[ -x .venv/bin/python ]] && default_python=.venv/bin/python
PYTHON=${PYTHON:-$default_python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [[ " $* " != *" --prepare "* ]] && ! "$PYTHON" -c "import pydantic" 2>/dev/null; then
  if ! compgen -G ".whl/*.whl" >/dev/null; then
    echo "error: pydantic is missing and .whl/ holds no wheels: run scripts/gpu_check.sh --prepare first" >&2
    exit 2
  fi
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
exec "$PYTHON" scripts/gpu_check.py "$@"
