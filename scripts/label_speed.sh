#!/usr/bin/env bash
# Issue 21's speed figures for labelling without a parser, each timed end to end (process start to exit) with
# /usr/bin/time: wall seconds, CPU seconds (user + sys) and peak RSS.
#
#   1. the model's own trees (--parser model) against Stanza trees on the same PAIRS_SMALL raw SNLI test pairs
#      (one size, or several separated by commas: 1000,10000), alternating, ROUNDS times each: medians and the
#      ratio;
#   2. --parser model on PAIRS raw SNLI test pairs (all 10,000 by default): median wall, pairs/s;
#   3. peak RSS of --parser model on 20,000 and on 200,000 pairs (SNLI test repeated under new ids);
#   4. --int8 on the PAIRS pairs: its time, and how often its labels and trees agree with fp32's;
#   5. `spinn bench-label` on the PAIRS pairs (model and end-to-end pairs/s inside the process).
#
#   scripts/label_speed.sh MODEL [PAIRS] [PAIRS_SMALL] [ROUNDS] [-- extra label options]
#   (defaults 10000, 1000 and 3; run from the repository root; MODEL: a spinn or rl checkpoint)
#
# The machine may be shared: runs alternate so each meets the same load, and the load average is printed.
set -euo pipefail
model=${1:?usage: scripts/label_speed.sh MODEL [PAIRS] [PAIRS_SMALL] [ROUNDS] [-- label options]}
pairs=${2:-10000}
small=${3:-1000}
rounds=${4:-3}
shift $(($# < 4 ? $# : 4))
[[ ${1:-} == "--" ]] && shift
extra=("$@")
root=$(cd "$(dirname "$0")/.." && pwd)
shared=$root/../shared
python=$root/.venv/bin/python
spinn=$root/.venv/bin/spinn
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" - "$shared/data/snli/snli_1.0_test.jsonl.gz" "$work" "$pairs" "$small" <<'EOF'
import csv, gzip, json, sys

source, folder, pairs, small = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with gzip.open(source, "rt", encoding="utf-8") as lines:
    records = [json.loads(line) for line in lines]
sizes = [(f"small{n}", int(n)) for n in small.split(",")]
for name, count in (*sizes, ("pairs", pairs), ("20k", 20_000), ("200k", 200_000)):
    with open(f"{folder}/{name}.csv", "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["pairID", "sentence1", "sentence2", "gold_label"])
        for i in range(count):
            r = records[i % len(records)]
            writer.writerow([f"{r['pairID']}.{i // len(records)}", r["sentence1"], r["sentence2"], r["gold_label"]])
EOF

# One end-to-end `spinn label` run: prints "wall cpu rss_mib".
timed() {
  local input=$1 parser=$2
  shift 2
  rm -rf "$work/out.parquet" "$work/out.parquet.parts" "$work/out.rejects.jsonl"
  /usr/bin/time -f "%e %U %S %M" -o "$work/time" "$spinn" label "$work/$input.csv" --model "$model" \
    --output "$work/out.parquet" --device cpu --parser "$parser" --no-parse-cache --no-progress \
    --stanza-dir "$shared/stanza/stanza_resources" "$@" >/dev/null
  awk '{printf "%.2f %.2f %.0f\n", $1, $2 + $3, $4 / 1024}' "$work/time"
}

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cpus; model $model; options: ${extra[*]:-none}"
for size in ${small//,/ }; do
  : >"$work/model.txt"
  : >"$work/stanza.txt"
  : >"$work/model_cpu.txt"
  : >"$work/stanza_cpu.txt"
  for round in $(seq "$rounds"); do
    read -r wall cpu rss < <(timed "small$size" model "${extra[@]}")
    echo "$wall" >>"$work/model.txt"
    echo "$cpu" >>"$work/model_cpu.txt"
    echo "round $round: model  $size pairs: wall ${wall} s, cpu ${cpu} s, peak RSS ${rss} MiB"
    read -r wall cpu rss < <(timed "small$size" stanza)
    echo "$wall" >>"$work/stanza.txt"
    echo "$cpu" >>"$work/stanza_cpu.txt"
    echo "round $round: stanza $size pairs: wall ${wall} s, cpu ${cpu} s, peak RSS ${rss} MiB"
  done
  model_median=$(median <"$work/model.txt")
  stanza_median=$(median <"$work/stanza.txt")
  awk -v m="$model_median" -v s="$stanza_median" -v n="$size" 'BEGIN {
    printf "%d pairs, median end to end: model %.2f s (%.0f pairs/s), stanza %.2f s (%.0f pairs/s): %.1fx\n",
      n, m, n / m, s, n / s, s / m }'
  awk -v m="$(median <"$work/model_cpu.txt")" -v s="$(median <"$work/stanza_cpu.txt")" \
    'BEGIN { printf "median CPU seconds: model %.2f, stanza %.2f: %.1fx\n", m, s, s / m }'
done

: >"$work/big.txt"
for round in $(seq "$rounds"); do
  read -r wall cpu rss < <(timed pairs model "${extra[@]}")
  echo "$wall" >>"$work/big.txt"
  echo "round $round: model $pairs pairs: wall ${wall} s, cpu ${cpu} s, peak RSS ${rss} MiB"
done
awk -v m="$(median <"$work/big.txt")" -v n="$pairs" \
  'BEGIN { printf "%d pairs, median end to end: %.2f s, %.0f pairs/s\n", n, m, n / m }'

cp "$work/out.parquet" "$work/fp32.parquet"
read -r wall cpu rss < <(timed pairs model --int8 "${extra[@]}")
echo "int8: model $pairs pairs: wall ${wall} s, cpu ${cpu} s, peak RSS ${rss} MiB"
"$python" - "$work/fp32.parquet" "$work/out.parquet" <<'PY'
import sys

import pyarrow.parquet as pq

columns = ["pair_id", "label", "premise_tree", "hypothesis_tree"]
fp32, int8 = (pq.read_table(path, columns=columns).to_pylist() for path in sys.argv[1:])
pairs = list(zip(fp32, int8, strict=True))
labels = sum(a["label"] == b["label"] for a, b in pairs)
trees = sum(a["premise_tree"] == b["premise_tree"] and a["hypothesis_tree"] == b["hypothesis_tree"] for a, b in pairs)
print(f"int8 against fp32: labels agree on {labels / len(pairs):.2%} of {len(pairs)} pairs, trees on {trees / len(pairs):.2%}")
PY

read -r _ _ rss20 < <(timed 20k model "${extra[@]}")
read -r wall200 cpu200 rss200 < <(timed 200k model "${extra[@]}")
awk -v a="$rss20" -v b="$rss200" -v w="$wall200" -v c="$cpu200" 'BEGIN {
  printf "peak RSS: 20000 pairs %d MiB, 200000 pairs %d MiB (%+.1f%%); 200000 pairs in %.1f s (cpu %.1f s, %.0f pairs/s)\n",
    a, b, 100 * (b - a) / a, w, c, 200000 / w }'

"$spinn" bench-label "$work/pairs.csv" --model "$model" --device cpu --parser model "${extra[@]}" | tail -1
