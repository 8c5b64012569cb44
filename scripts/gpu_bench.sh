#!/usr/bin/env bash
# SPINN-PI on one CUDA GPU: fast vs reference, train and infer, D=300, batch 256,
# on the SNLI dev trees resampled to a full SNLI training epoch (550,152 pairs).
# Prints one JSON line per run. Targets: a 550k-pair training epoch under 30 s on
# one H100, inference above 50,000 pairs/s, and at least 30x the reference.
#
#   scripts/gpu_bench.sh                 # from the repository root, venv active
#   CORPUS=path/to/snli_dev.jsonl.gz PYTHON=.venv/bin/python scripts/gpu_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}
CORPUS=${CORPUS:-../shared/data/snli/snli_1.0_dev.jsonl.gz}
PAIRS=${PAIRS:-550152}
BATCH=${BATCH:-256}
REFERENCE_STEPS=${REFERENCE_STEPS:-30}   # the reference is slow; pairs/s from 30 batches is enough

"$PYTHON" - "$CORPUS" "$PAIRS" "$BATCH" "$REFERENCE_STEPS" <<'PY'
import json
import sys

import torch

from spinn.bench import run_bench

corpus, pairs, batch, reference_steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if not torch.cuda.is_available():
    sys.exit("gpu_bench.sh: no CUDA device visible to torch; run it on a GPU machine")
epoch_steps = -(-pairs // batch)
common = dict(corpus=corpus, pairs=pairs, variant="pi", batch_size=batch, d_hidden=300, d_tracker=64,
              d_embed=300, device="cuda", warmup=5)
runs = [
    dict(mode="train", impl="fast", steps=epoch_steps),
    dict(mode="train", impl="fast", steps=epoch_steps, amp=True),
    dict(mode="infer", impl="fast", steps=epoch_steps),
    dict(mode="infer", impl="fast", steps=epoch_steps, amp=True),
    dict(mode="train", impl="fast", steps=200, compose="all"),
    dict(mode="infer", impl="fast", steps=200, compose="all"),
    dict(mode="train", impl="reference", steps=reference_steps),
    dict(mode="infer", impl="reference", steps=reference_steps),
]
for run in runs:
    print(json.dumps(run_bench(**common, **run)), flush=True)
PY
