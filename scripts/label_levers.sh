#!/usr/bin/env bash
# Issue 17's levers, one `spinn bench-label` per setting, interleaved over rounds so that each meets the same
# load: parser workers (default auto: one per core), threads, Stanza batch size, pretokenized input. Input:
# the first PAIRS real SNLI test pairs as raw text (CSV), and the same pairs with SNLI's own tokens (for
# --pretokenized). No parse cache.
#
#   scripts/label_levers.sh [PAIRS] [ROUNDS]        (defaults 1000 and 2; run from the repository root)
set -euo pipefail
pairs=${1:-1000}
rounds=${2:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
shared=$root/../shared
python=$root/.venv/bin/python
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" - "$shared/data/snli/snli_1.0_test.jsonl.gz" "$pairs" "$work" <<'EOF'
import csv, gzip, json, sys
from spinn.trees.transitions import read_binary_parse

source, count, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with gzip.open(source, "rt", encoding="utf-8") as lines:
    records = [json.loads(line) for _, line in zip(range(count), lines)]
for name, text in (
    ("raw", lambda r, k: r[f"sentence{k}"]),
    ("tokens", lambda r, k: " ".join(read_binary_parse(r[f"sentence{k}_binary_parse"])[0])),
):
    with open(f"{folder}/{name}.csv", "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["pairID", "sentence1", "sentence2", "gold_label"])
        writer.writerows([r["pairID"], text(r, 1), text(r, 2), r["gold_label"]] for r in records)
EOF

bench=("$root/.venv/bin/spinn" bench-label --model "$root/tests/fixtures/release-0.1.0/checkpoint.pt"
  --stanza-dir "$shared/stanza/stanza_resources" --device cpu --parser stanza)
for round in $(seq "$rounds"); do
  while read -r name input options; do
    # shellcheck disable=SC2086  # options are words
    line=$("${bench[@]}" "$work/$input" $options 2>/dev/null | tail -1)
    echo "round $round | $name | load $(cut -d' ' -f1 /proc/loadavg) | $line"
  done <<'LIST'
default raw.csv
one-process raw.csv --workers 1
one-process-threads-2 raw.csv --workers 1 --parser-threads 2 --threads 2
parse-batch-64 raw.csv --parse-batch-size 64
parse-batch-1024 raw.csv --parse-batch-size 1024
tokens-as-raw tokens.csv
pretokenized tokens.csv --pretokenized
LIST
done
