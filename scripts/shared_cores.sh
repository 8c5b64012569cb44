#!/usr/bin/env bash
# Training and labelling on cores that other work shares: `threads: auto` (the rule of spinn/ground/cores.py) against one
# thread, and optionally against another checkout's `spinn` (BASELINE, e.g. the previous release's auto), with the
# cores idle, with one busy process per core beside the run, and with two. A busy process is a pure-Python loop
# (`while True: pass`), started before the measured command and stopped after it.
#
#   scripts/shared_cores.sh MODEL [PAIRS] [BASELINE]
#   (run from anywhere; MODEL: a spinn or rl checkpoint; when the file does not exist, a 300D `spinn` model with
#   random weights and SNLI dev's vocabulary is written there first: speed does not depend on the weights' values.
#   PAIRS: raw SNLI test pairs to label, default 10000. BASELINE: another `spinn` executable, e.g.
#   /path/to/old/checkout/.venv/bin/spinn; its training runs with --threads set to the usable cores, its old auto.)
#   GOMP_DEFAULT=1 adds auto with libgomp's own spin (GOMP_SPINCOUNT=300000, what a user gets by setting it), to
#   tell the thread rule's part from the short spin's. ROUNDS=3 repeats every measurement (the table shows
#   medians; default 1); STEPS timed training steps (default 12); LEVELS the busy processes per core to measure
#   with (default "0 1 2"; 0, the idle cores, is what the shares of idle divide by).
#
# Labelling: `spinn label --parser model` on PAIRS raw pairs, process start to exit, in pairs/s. Training:
# `spinn bench --mode train` (300D spinn, batch 32, the training step `spinn train` runs) in pairs/s over its timed
# steps. Prints one table: each case's rates, the threads it started with (and ended with, when they changed), and
# each rate as a share of the same case's rate on idle cores.
set -euo pipefail
model=${1:?usage: scripts/shared_cores.sh MODEL [PAIRS] [BASELINE]}
pairs=${2:-10000}
baseline=${3:-}
rounds=${ROUNDS:-1}
steps=${STEPS:-12}
root=$(cd "$(dirname "$0")/.." && pwd)
snli=$root/../shared/data/snli
python=$root/.venv/bin/python
spinn=$root/.venv/bin/spinn
work=$(mktemp -d)
LIBGOMP_SPIN=300000 # libgomp's spin when neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set
neighbours=()
stop_neighbours() {
  if ((${#neighbours[@]})); then
    kill "${neighbours[@]}" 2>/dev/null || true
    wait "${neighbours[@]}" 2>/dev/null || true
  fi
  neighbours=()
}
trap 'stop_neighbours; rm -rf "$work"' EXIT
cores=$("$python" -c 'from spinn.ground.cores import usable_cores; print(usable_cores())')

if [[ ! -e $model ]]; then
  "$python" - "$snli/snli_1.0_dev.jsonl.gz" "$model" <<'EOF'
import sys
from pathlib import Path

import torch

from spinn.data.pairs import corpus_vocabulary, read_raw_pairs
from spinn.model.checkpoint import Checkpoint, save_checkpoint
from spinn.model.config import SPINNConfig
from spinn.model.spinn import SPINN, random_vectors

torch.manual_seed(0)
vocabulary = corpus_vocabulary(read_raw_pairs(Path(sys.argv[1])))
config = SPINNConfig(variant="spinn", d_embed=300, d_hidden=300)
model = SPINN(config, random_vectors(len(vocabulary), config.d_embed))
save_checkpoint(Path(sys.argv[2]), Checkpoint(model.state_dict(), config.to_dict(), vocabulary.to_json(), step=0))
print(f"wrote {sys.argv[2]}: a 300D spinn model with random weights, {len(vocabulary)} words")
EOF
fi

"$python" - "$snli/snli_1.0_test.jsonl.gz" "$work/pairs.csv" "$pairs" <<'EOF'
import csv, gzip, json, sys

source, path, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3])
with gzip.open(source, "rt", encoding="utf-8") as lines:
    records = [json.loads(line) for line in lines]
with open(path, "w", newline="", encoding="utf-8") as out:
    writer = csv.writer(out)
    writer.writerow(["pairID", "sentence1", "sentence2"])
    for i in range(pairs):
        r = records[i % len(records)]
        writer.writerow([f"{r['pairID']}.{i // len(records)}", r["sentence1"], r["sentence2"]])
EOF

start_neighbours() {
  local count=$1
  for ((i = 0; i < count; i++)); do
    "$python" -c "while True: pass" &
    neighbours+=($!)
  done
  sleep 1  # running before the measured process starts
}

# One labelling run: prints "pairs/s threads".
label() {
  local command=$1 threads=$2 spin=$3 began ended
  rm -rf "$work"/out.* "$work"/.out.*
  began=$(date +%s.%N)
  env GOMP_SPINCOUNT="$spin" "$command" label "$work/pairs.csv" --model "$model" --output "$work/out.parquet" --device cpu --parser model \
    --no-progress --threads "$threads" >"$work/stdout" 2>"$work/stderr"
  ended=$(date +%s.%N)
  awk -v p="$pairs" -v b="$began" -v e="$ended" 'BEGIN {printf "%.0f ", p / (e - b)}'
  grep -o '([0-9]* threads)' "$work/stdout" | tr -dc '0-9'
  echo
}

# One training benchmark: prints "pairs/s threads" (threads at the start, and at the end when they changed).
train() {
  local command=$1 threads=$2 spin=$3
  env GOMP_SPINCOUNT="$spin" "$command" bench --corpus "$snli/snli_1.0_dev.jsonl.gz" --variant spinn --mode train --batch-size 32 \
    --d-hidden 300 --d-embed 300 --steps "$steps" --warmup 2 --threads "$threads" --json >"$work/bench.json"
  "$python" - "$work/bench.json" <<'EOF'
import json, sys

result = json.load(open(sys.argv[1]))
start, end = result["threads"], result.get("threads_at_end", result["threads"])
print(f"{result['pairs_per_second']:.1f} {start if start == end else f'{start}-{end}'}")
EOF
}

# name:spinn:label threads:train threads:GOMP_SPINCOUNT (spinn/ground/cores.py's, or libgomp's own for the baseline)
spin=$("$python" -c 'from spinn.ground.cores import OPENMP_WAIT; print(OPENMP_WAIT["GOMP_SPINCOUNT"])')
cases=("auto:$spinn:auto:auto:$spin" "1:$spinn:1:1:$spin")
[[ -n ${GOMP_DEFAULT:-} ]] && cases+=("auto-gomp:$spinn:auto:auto:$LIBGOMP_SPIN")
[[ -n $baseline ]] && cases+=("baseline:$baseline:auto:$cores:$LIBGOMP_SPIN")
echo "$(nproc) cpus, $cores usable; model $model; $pairs pairs; $rounds round(s); load average at start:" \
  "$(cut -d' ' -f1-3 /proc/loadavg)"
for level in ${LEVELS:-0 1 2}; do
  start_neighbours $((level * cores))
  for ((round = 0; round < rounds; round++)); do
    for case in "${cases[@]}"; do # interleaved: each case meets the same load
      IFS=: read -r name command label_threads train_threads spin <<<"$case"
      labelled=$(label "$command" "$label_threads" "$spin")
      trained=$(train "$command" "$train_threads" "$spin")
      echo "$level $name $labelled $trained" >>"$work/rates"
    done
  done
  stop_neighbours
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

"$python" - "$work/rates" <<'EOF'
import statistics, sys

LEVELS = {"0": "idle", "1": "1 busy per core", "2": "2 busy per core"}
rows = {}
for line in open(sys.argv[1]):
    level, name, label_rate, label_threads, train_rate, train_threads = line.split()
    row = rows.setdefault((level, name), {"label": [], "train": []})
    row["label"].append(float(label_rate))
    row["train"].append(float(train_rate))
    row["threads"] = (label_threads, train_threads)
print(f"\n{'cores':16} {'threads':9} {'label pairs/s':>13} {'threads':>7} {'train pairs/s':>13} {'threads':>7}"
      f" {'label/idle':>10} {'train/idle':>10}")
for (level, name), row in rows.items():
    label, train = statistics.median(row["label"]), statistics.median(row["train"])
    idle = rows[("0", name)]
    shares = [100 * value / statistics.median(idle[work]) for value, work in ((label, "label"), (train, "train"))]
    print(f"{LEVELS[level]:16} {name:9} {label:13.0f} {row['threads'][0]:>7} {train:13.1f} {row['threads'][1]:>7}"
          f" {shares[0]:9.0f}% {shares[1]:9.0f}%")
EOF
