# Sourced by .ci/run: wall and CPU time of every phase and of every test, the tests four
# processes at a time, and the closing tables that show what made CI slower. Records go to
# files, so phases run in subshells and workers count too.
ci_out=$PWD/target/ci
mkdir -p "$ci_out"
rm -f "$ci_out"/test-*.log
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

# One test binary (or the tests of it that ARGS select) in its package's directory, as cargo
# test runs it, its output kept in a log and printed whole when it ends (workers must not
# interleave). One test at a time: each test's time from libtest's --report-time (unstable:
# RUSTC_BOOTSTRAP for this process only, not for rustc) is then its own, not a wait for the
# shared lock of common::serial().
run_test_binary() {
  local dir=$1 exe=$2 label=$3 log=$4 rc=0
  shift 4
  log="$ci_out/test-$log.log"
  (cd "$dir" && RUSTC_BOOTSTRAP=1 "$exe" -Z unstable-options --report-time --test-threads=1 "$@") >"$log" 2>&1 || rc=$?
  flock "$ci_out/print.lock" cat "$log"
  # "test NAME ... ok <1.234s>"
  # The label's binary: a first-phase label also names its test, which the line names anyway.
  local binary=${label%% *}
  sed -nE 's/^test (.+) \.\.\. (ok|FAILED) <([0-9.]+)s>$/\3\t'"${binary//\//\\/}"': \1/p' "$log" >>"$ci_out/tests.tsv"
  return $rc
}

# Takes the first line of queue file $1 under a lock and prints it; nothing once it is empty.
ci_pop() {
  flock "$1.lock" sh -c 'head -n1 "$1"; sed -i 1d "$1"' _ "$1"
}

# One worker: rows of queue file $1 (a test binary, a module of it or one test) until it is
# empty; all run even when one fails, so one CI run shows every failure (failed.txt names them).
run_worker() {
  local row dir exe label log args
  while row=$(ci_pop "$1") && [ -n "$row" ]; do
    IFS=$'\t' read -r dir exe label log args <<<"$row"
    # The arguments are test names and libtest's flags: no spaces, no quotes.
    # shellcheck disable=SC2086
    timed "test: $label" run_test_binary "$dir" "$exe" "$label" "$log" $args ||
      echo "$label" >>"$ci_out/failed.txt"
  done
}

# run_test_binaries ARTIFACTS ORDER...: every test binary in cargo's artifact messages, in two
# phases. First, one at a time, the tests that need the machine to themselves (those that call
# common::quiet() or common::alone(): CPU per gigabit, the guest's timers, Chromium's clock):
# scheduled among the others, each one waited for the tests already running to end (a guest
# test of 140 s, say) while the workers idled behind it, and the waits were minutes of a slow
# host's CI. Then the rest, four processes at a time (CI_WORKERS; on 2 cores: the lab's
# emulator and the kernel's qdiscs mostly wait on the clock, the tests kept 0.7 of the 2 cores
# busy with three; a fifth starved the guest's CAKE beside the labs, and later, with that test
# in the first phase, made the phase no shorter on a slow hour and the lab's endpoints too
# slow for `lab compare`, BENCHMARKS.md; the guest as a router at real-time priority, the
# lab's forwarders too): a binary each, or one module each of a binary made of modules (the
# `bloatlab` binary's tests: tests/main.rs), without their first-phase tests; within a process
# its tests take turns (common::serial()). The subjects named in ORDER (package/target or
# package/module) first, in that order (longest first balances the workers), then the rest
# (the unit tests). Fails when any test did.
run_test_binaries() {
  local artifacts=$1
  shift
  python3 -c '
import json, os, re, sys
order = sys.argv[2:]

def tests(src):
    """The #[test] functions of a test file: (name, whether its body takes the machine:
    tests/common)."""
    found = []
    for part in re.split(r"\n#\[test\]\n", open(src).read())[1:]:
        m = re.match(r"\s*fn\s+(\w+)", part)
        # rustfmt closes a top-level function with a brace in column 0.
        if m:
            found.append((m.group(1), bool(re.search(r"\b(quiet|alone)\(\)", part.split("\n}\n")[0]))))
    return found

def machine_tests(src):
    """The tests of a file that take the machine. Filters and skips match by substring, so
    none of their names may be part of the name of another test."""
    found = tests(src)
    names = [n for n, _ in found]
    machine = [n for n, takes in found if takes]
    for t in machine:
        clash = [n for n in names if n != t and t in n]
        if clash:
            sys.exit(f"ci: {src}: skipping {t} would skip {clash} too: rename one")
    return machine

def modules(src):
    """The subjects of a test target: its `mod NAME;` files beside it (tests/main.rs: one binary
    for the whole package), each run as a binary of its own was; or the target itself."""
    names = re.findall(r"^mod (\w+);", open(src).read(), re.M)
    here = os.path.dirname(src)
    return [(n, os.path.join(here, n + ".rs")) for n in names if n != "common"]

rows, first = [], []
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        pkg, kind, name = os.path.basename(os.path.dirname(m["manifest_path"])), m["target"]["kind"][0], m["target"]["name"]
        exe, where = m["executable"], os.path.dirname(m["manifest_path"])
        log = os.path.basename(exe)
        src = m["target"]["src_path"]
        # (label, log, the filter of its tests, its tests that take the machine)
        if kind == "test" and modules(src):
            subjects = [(f"{pkg}/{mod}", f"{log}-{mod}", f"{mod}::", [f"{mod}::{t}" for t in machine_tests(path)])
                        for mod, path in modules(src)]
        elif kind == "test":
            subjects = [(f"{pkg}/{name}", log, "", machine_tests(src))]
        else:
            subjects = [(f"{pkg} ({kind})", log, "", [])]
        for label, log, only, alone in subjects:
            for t in alone:
                short = t.split("::")[-1]
                first.append("\t".join([where, exe, f"{label} {short}", f"{log}-{short}", f"--exact {t}"]))
            # Filters match by substring: `module::` starts the names of that module only.
            args = " ".join(([only] if only else []) + [f"--skip {t}" for t in alone])
            rows.append((order.index(label) if label in order else len(order), "\t".join([where, exe, label, log, args])))
with open(os.path.join(os.environ["ci_out"], "queue-alone.tsv"), "w") as f:
    f.writelines(r + "\n" for r in first)
with open(os.path.join(os.environ["ci_out"], "queue.tsv"), "w") as f:
    f.writelines(r + "\n" for _, r in sorted(rows, key=lambda r: r[0]))
' "$artifacts" "$@"
  [ ! -s "$ci_out/queue-alone.tsv" ] ||
    timed "tests: those that take the machine, one at a time" run_worker "$ci_out/queue-alone.tsv"
  local pids=() i
  for ((i = 1; i < ${CI_WORKERS:-4}; i++)); do
    run_worker "$ci_out/queue.tsv" &
    pids+=($!)
  done
  run_worker "$ci_out/queue.tsv"
  [ ${#pids[@]} = 0 ] || wait "${pids[@]}"
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
