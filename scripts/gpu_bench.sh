#!/usr/bin/env bash
# The GPU-speed table of the project (one CUDA GPU): SPINN-PI 300D on the SNLI dev trees resampled
# to a full SNLI training epoch (550,152 pairs). Prints one JSON line per run, then the table:
# bench train at batch 256 and 1024, inference at batch 1024 in bf16, the real training loop
# (loader thread, metric reads) at 256 and at the shipped GPU batch (batch_size auto), the fast
# step against the seed article's reference, and the share of wall time the GPU is busy with the
# kernels per step. Goals (the GPU-speed issue): >= 40,000 and >= 80,000 pairs/s training,
# >= 200,000 inferring, the loop >= 90% of the bench, an epoch < 30 s, >= 30x the reference,
# GPU busy >= 70%.
#
#   scripts/gpu_bench.sh                                  # .venv/bin/python when README's install made it
#   CORPUS=path/to/snli_dev.jsonl.gz PYTHON=python3 scripts/gpu_bench.sh
#
# Needs torch with CUDA, numpy, pyarrow, pydantic, pyyaml, click, tqdm (no MLflow, Prefect, Stanza or
# DVC). On a bare image without pydantic, wheels in .whl/ are installed first (pydantic, pydantic-core,
# annotated-types, typing-inspection, for this Python).
set -euo pipefail
cd "$(dirname "$0")/.."

# README's commands need no activated venv: take the project's .venv when there is one, else (a bare GPU
# image) the python on PATH.
default_python=python
[[ -x .venv/bin/python ]] && default_python=.venv/bin/python
PYTHON=${PYTHON:-$default_python}
CORPUS=${CORPUS:-../shared/data/snli/snli_1.0_dev.jsonl.gz}
PAIRS=${PAIRS:-550152}
REFERENCE_STEPS=${REFERENCE_STEPS:-30}   # the reference is slow; pairs/s from 30 batches is enough
if ! "$PYTHON" -c "import pydantic" 2>/dev/null && [ -d .whl ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --target /tmp/spinn-site .whl/*.whl
  export PYTHONPATH="/tmp/spinn-site${PYTHONPATH:+:$PYTHONPATH}"
fi

"$PYTHON" - "$CORPUS" "$PAIRS" "$REFERENCE_STEPS" <<'PY'
import json
import sys

import torch

from spinn.bench import BenchSettings, run_bench
from spinn.training.config import GPU_BATCH_SIZE

corpus, pairs, reference_steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if not torch.cuda.is_available():
    sys.exit("gpu_bench.sh: no CUDA device visible to torch; run it on a GPU machine")


def epoch_steps(batch: int) -> int:
    return -(-pairs // batch)


def bench(label: str, **settings) -> dict:
    common = dict(corpus=corpus, pairs=pairs, variant="pi", d_hidden=300, d_tracker=64, d_embed=300, device="cuda",
                  warmup=40)
    result = run_bench(BenchSettings(**{**common, **settings}))
    print(json.dumps({"label": label, **result}), flush=True)
    return result


rows = {
    "train 256": bench("train 256", mode="train", batch_size=256, steps=epoch_steps(256)),
    "train 1024": bench("train 1024", mode="train", batch_size=1024, steps=epoch_steps(1024)),
    "infer 1024 bf16": bench("infer 1024 bf16", mode="infer", batch_size=1024, amp=True, steps=epoch_steps(1024)),
    "loop 256": bench("loop 256", mode="loop", batch_size=256, steps=epoch_steps(256)),
    "loop shipped": bench("loop shipped", mode="loop", batch_size=GPU_BATCH_SIZE, steps=epoch_steps(GPU_BATCH_SIZE)),
    "reference 256": bench("reference 256", mode="train", impl="reference", batch_size=256, steps=reference_steps,
                           warmup=3),
    "profile 256": bench("profile 256", mode="train", batch_size=256, steps=50, profile=True, count_ops=True),
}
print()
print(f"{'what':<44} {'pairs/s':>10} {'ms/step':>8} {'epoch s':>8} {'peak MiB':>9}")
for name, found in rows.items():
    epoch = pairs / found["pairs_per_second"]
    print(f"{name:<44} {found['pairs_per_second']:>10.0f} {found['seconds_per_step'] * 1000:>8.1f} {epoch:>8.1f} "
          f"{found['peak_memory_bytes'] / 2**20:>9.0f}")
loop, train = rows["loop 256"]["pairs_per_second"], rows["train 256"]["pairs_per_second"]
profile = rows["profile 256"]
print(f"real loop / bench at batch 256: {loop / train:.1%} (goal >= 90%)")
print(f"fast / reference at batch 256: {train / rows['reference 256']['pairs_per_second']:.1f}x (goal >= 30x)")
print(f"GPU busy {profile['gpu_busy_share']:.1%} of a step's wall time (goal >= 70%), "
      f"{profile['kernels_per_step']:.0f} kernels per step, {profile['ops_per_transition_step']:.1f} aten ops per "
      f"transition step eager, {profile['syncs_per_step']:.0f} host syncs per step")
print(f"device: {profile['device_name']}, torch {profile['torch']}")
PY
