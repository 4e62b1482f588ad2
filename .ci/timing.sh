# Sourced by .ci/run: wall and CPU time of every phase and of every test, the test binaries two
# at a time, and the closing tables that show what made CI slower. Records go to files, so
# phases run in subshells and workers count too.
ci_out=$PWD/target/ci
mkdir -p "$ci_out"
rm -f "$ci_out"/test-*.log "$ci_out"/done-*
: >"$ci_out/phases.tsv"
: >"$ci_out/tests.tsv"
: >"$ci_out/failed.txt"
ci_start=$(date +%s.%N)
export ci_out

ci_elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# The machine's busy and total jiffies since boot (all cores, /proc/stat): busy is all but idle
# and iowait.
ci_jiffies() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat; }

# timed NAME COMMAND...: runs COMMAND, records its wall and CPU time (user + system, children
# included, not daemons they leave such as a lab's) and how busy the whole machine was
# meanwhile (both cores, whatever ran beside it) under NAME, keeps its exit code.
timed() {
  local name=$1 rc=0 tf b0 t0 b1 t1
  shift
  tf=$(mktemp)
  echo "ci: >> $name" >&2
  read -r b0 t0 < <(ci_jiffies)
  local TIMEFORMAT=$'%R\t%U\t%S'
  { time "$@" 2>&3 3>&-; } 3>&2 2>"$tf" || rc=$?
  read -r b1 t1 < <(ci_jiffies)
  local wall cpu busy
  read -r wall cpu < <(awk -F'\t' 'END { printf "%.1f %.1f\n", $1, $2 + $3 }' "$tf")
  busy=$(awk -v b=$((b1 - b0)) -v t=$((t1 - t0)) 'BEGIN { printf "%.0f", (t > 0 ? 100 * b / t : 0) }')
  rm -f "$tf"
  printf '%s\t%s\t%s\t%s\n' "$wall" "$cpu" "$busy" "$name" >>"$ci_out/phases.tsv"
  echo "ci: << $name: ${wall} s wall, ${cpu} s CPU, machine ${busy}% busy$([ $rc = 0 ] || echo ", exit $rc")" >&2
  return $rc
}
export -f timed ci_elapsed ci_jiffies

# One test binary in its package's directory, as cargo test runs it, its output kept in a log
# and printed whole when it ends (workers must not interleave). One test at a time: each
# test's time from libtest's --report-time (unstable: RUSTC_BOOTSTRAP for this process only,
# not for rustc) is then its own, not a wait for the shared lock of common::serial().
run_test_binary() {
  local dir=$1 exe=$2 label=$3 log rc=0
  log="$ci_out/test-$(basename "$exe").log"
  (cd "$dir" && RUSTC_BOOTSTRAP=1 "$exe" -Z unstable-options --report-time --test-threads=1) >"$log" 2>&1 || rc=$?
  flock "$ci_out/print.lock" cat "$log"
  # "test NAME ... ok <1.234s>"
  sed -nE 's/^test (.+) \.\.\. (ok|FAILED) <([0-9.]+)s>$/\3\t'"${label//\//\\/}"': \1/p' "$log" >>"$ci_out/tests.tsv"
  touch "$ci_out/done-${label//[^A-Za-z0-9_.-]/_}"
  return $rc
}

# ci_after_tests LABEL...: returns once the test binaries LABEL (package/target) have ended, or
# all of them have (a label that names no binary waits no longer than that).
ci_after_tests() {
  local label
  for label in "$@"; do
    while [ ! -e "$ci_out/done-${label//[^A-Za-z0-9_.-]/_}" ] && [ ! -e "$ci_out/done-all" ]; do sleep 1; done
  done
}

# Takes the first line of queue file $1 under a lock and prints it; nothing once it is empty.
ci_pop() {
  flock "$1.lock" sh -c 'head -n1 "$1"; sed -i 1d "$1"' _ "$1"
}

# One worker: test binaries from the queue until it is empty; all run even when one fails, so
# one CI run shows every failure (failed.txt names them).
run_worker() {
  local row dir name exe label
  while row=$(ci_pop "$ci_out/queue.tsv") && [ -n "$row" ]; do
    IFS=$'\t' read -r dir name exe label <<<"$row"
    timed "test: $label" run_test_binary "$dir" "$exe" "$label" || echo "$label" >>"$ci_out/failed.txt"
  done
}

# run_test_binaries ARTIFACTS ORDER...: every test binary in cargo's artifact messages, three
# at a time (CI_WORKERS; on 2 cores: the lab's emulator and the kernel's qdiscs mostly wait on
# the clock, the machine was 30-40% busy with two, BENCHMARKS.md). Within a binary its tests
# take turns (common::serial()); a test that needs the machine to itself (common::quiet(),
# common::alone()) waits for the other binaries' tests to end and holds off their next ones.
# The binaries named in ORDER (package/target) first, in that order (longest first balances
# the workers), then the rest (the unit tests). Fails when any test did.
run_test_binaries() {
  local artifacts=$1
  shift
  python3 -c '
import json, os, sys
order = sys.argv[2:]
rows = []
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        pkg, kind, name = os.path.basename(os.path.dirname(m["manifest_path"])), m["target"]["kind"][0], m["target"]["name"]
        label = f"{pkg}/{name}" if kind == "test" else f"{pkg} ({kind})"
        rows.append((order.index(label) if label in order else len(order), "\t".join([os.path.dirname(m["manifest_path"]), name, m["executable"], label])))
with open(os.path.join(os.environ["ci_out"], "queue.tsv"), "w") as f:
    f.writelines(r + "\n" for _, r in sorted(rows, key=lambda r: r[0]))
' "$artifacts" "$@"
  local pids=() i
  for ((i = 1; i < ${CI_WORKERS:-3}; i++)); do
    run_worker &
    pids+=($!)
  done
  run_worker
  [ ${#pids[@]} = 0 ] || wait "${pids[@]}"
  touch "$ci_out/done-all"
  [ ! -s "$ci_out/failed.txt" ]
}

# The summary reports; it never decides. It runs with errexit off and ends
# with the run's own status, so a reporting slip cannot fail (or pass) CI.
ci_summary() {
  local rc=$?
  set +e
  echo
  echo "ci: phases (wall s, CPU s, machine busy %)"
  awk -F'\t' '{ printf "  %8.1f %8.1f %4d%%  %s\n", $1, $2, $3, $4 }' "$ci_out/phases.tsv"
  echo "ci: ten slowest tests (wall s)"
  # awk reads all of sort's output: `head` would close the pipe early and
  # sort's SIGPIPE (141) ended run 7 under pipefail after every test passed.
  sort -t$'\t' -k1,1 -rn "$ci_out/tests.tsv" | awk -F'\t' 'NR <= 10 { printf "  %8.1f  %s\n", $1, $2 }'
  [ ! -s "$ci_out/failed.txt" ] || { echo "ci: failed test binaries:"; sed 's/^/  /' "$ci_out/failed.txt"; }
  echo "ci: total $(ci_elapsed "$ci_start") s, exit $rc"
  local passed failed
  passed=$(grep -hoE '^test result: [A-Za-z]+\. [0-9]+ passed' "$ci_out"/test-*.log 2>/dev/null | awk '{ s += $4 } END { print s + 0 }')
  failed=$(grep -hoE '; [0-9]+ failed' "$ci_out"/test-*.log 2>/dev/null | awk '{ s += $2 } END { print s + 0 }')
  echo "tests: $passed passed, $failed failed"
  exit "$rc"
}
trap ci_summary EXIT
