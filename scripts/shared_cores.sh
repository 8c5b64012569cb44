#!/usr/bin/env bash
# Issue 21 item 6: training and labelling on cores other work shares, with one torch thread and with the
# thread count auto picks (the CPUs this process may use), and auto with OpenMP's passive wait
# (OMP_WAIT_POLICY=PASSIVE: a thread that waits for the others sleeps instead of spinning, which costs a
# little on idle cores and saves much on busy ones). Each case is one process timed end to end with
# /usr/bin/time; "busy" runs a pure-Python busy loop per BUSY beside it for the whole run.
#
#   scripts/shared_cores.sh MODEL [PAIRS] [BUSY]
#   (defaults 10000 and 1; run from the repository root; MODEL: a spinn or rl checkpoint for labelling)
#
# Prints one line per case: workload, threads, neighbours, wall s, CPU s, and the work rate.
set -euo pipefail
model=${1:?usage: scripts/shared_cores.sh MODEL [PAIRS] [BUSY]}
pairs=${2:-10000}
busy=${3:-1}
root=$(cd "$(dirname "$0")/.." && pwd)
shared=$root/../shared
python=$root/.venv/bin/python
spinn=$root/.venv/bin/spinn
work=$(mktemp -d)
neighbours=()
stop_neighbours() {
  ((${#neighbours[@]})) && kill "${neighbours[@]}" 2>/dev/null && wait "${neighbours[@]}" 2>/dev/null
  neighbours=()
}
trap 'stop_neighbours; rm -rf "$work"' EXIT

"$python" - "$shared/data/snli/snli_1.0_test.jsonl.gz" "$work/pairs.csv" "$pairs" <<'EOF'
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
}

# One timed process: prints "wall cpu".
timed() {
  /usr/bin/time -f "%e %U %S" -o "$work/time" "$@" >"$work/stdout" 2>/dev/null
  awk '{printf "%.2f %.2f", $1, $2 + $3}' "$work/time"
}

# Threads case -> the environment and the --threads value of a run.
policy() { [[ $1 == auto-passive ]] && echo OMP_WAIT_POLICY=PASSIVE || echo -u OMP_WAIT_POLICY; }
threads_of() { [[ $1 == auto-passive ]] && echo auto || echo "$1"; }

label() {
  rm -rf "$work/out.parquet" "$work/out.parquet.parts" "$work/out.rejects.jsonl" "$work/out.parquet.run.json"
  timed env $(policy "$1") "$spinn" label "$work/pairs.csv" --model "$model" --output "$work/out.parquet" --device cpu \
    --parser model --no-progress --threads "$(threads_of "$1")"
}

train() {
  # auto as spinn train decides it (the usable cores); spinn bench's own default is torch's choice.
  local threads
  threads=$(threads_of "$1")
  [[ $threads == auto ]] && threads=$("$python" -c 'from spinn.settings import usable_cores; print(usable_cores())')
  timed env $(policy "$1") "$spinn" bench --corpus "$shared/data/snli/snli_1.0_dev.jsonl.gz" --variant spinn --mode train \
    --batch-size 32 --steps 20 --warmup 2 --threads "$threads"
}

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cpus; $busy busy neighbour(s) when busy"
printf "%-8s %-12s %-10s %8s %8s  %s\n" workload threads neighbours wall_s cpu_s rate
for neighbourhood in quiet busy; do
  [[ $neighbourhood == busy ]] && start_neighbours "$busy"
  for threads in 1 auto auto-passive; do
    read -r wall cpu <<<"$(label "$threads")"
    rate=$(awk -v p="$pairs" -v w="$wall" 'BEGIN {printf "%.0f pairs/s", p / w}')
    printf "%-8s %-12s %-10s %8s %8s  %s\n" label "$threads" "$neighbourhood" "$wall" "$cpu" "$rate"
    read -r wall cpu <<<"$(train "$threads")"
    rate=$(grep -o '[0-9]* pairs/s' "$work/stdout" | head -1)
    printf "%-8s %-12s %-10s %8s %8s  %s\n" train "$threads" "$neighbourhood" "$wall" "$cpu" "$rate (step only)"
  done
  stop_neighbours
done
