# Sourced by .ci/run: wall time of every phase and of every test, and the closing tables that
# show which of them made CI slower. Records go to files, so phases run in subshells count too.
ci_out=target/ci
mkdir -p "$ci_out"
: >"$ci_out/phases.tsv"
: >"$ci_out/tests.tsv"
: >"$ci_out/failed.txt"
ci_start=$(date +%s.%N)

ci_elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# timed NAME COMMAND...: runs COMMAND, records its wall time under NAME, keeps its exit code.
timed() {
  local name=$1 start rc=0
  shift
  start=$(date +%s.%N)
  echo "ci: >> $name" >&2
  "$@" || rc=$?
  local took
  took=$(ci_elapsed "$start")
  printf '%s\t%s\n' "$took" "$name" >>"$ci_out/phases.tsv"
  echo "ci: << $name: ${took} s$([ $rc = 0 ] || echo ", exit $rc")" >&2
  return $rc
}

# One test binary in its package's directory, as cargo test runs it, with each test's own time
# from libtest's --report-time (unstable: RUSTC_BOOTSTRAP for this process only, not for rustc).
run_test_binary() {
  local dir=$1 exe=$2 label=$3 log
  log="$ci_out/test-$(basename "$exe").log"
  local rc=0
  (cd "$dir" && RUSTC_BOOTSTRAP=1 "$exe" -Z unstable-options --report-time) 2>&1 | tee "$log" || rc=$?
  # "test NAME ... ok <1.234s>"
  sed -nE 's/^test (.+) \.\.\. (ok|FAILED) <([0-9.]+)s>$/\3\t'"${label//\//\\/}"': \1/p' "$log" >>"$ci_out/tests.tsv"
  return $rc
}

# Every test binary named in cargo's artifact messages, each timed; all run even when one fails,
# so one CI run shows every failure; the caller's exit code says whether any did.
run_test_binaries() {
  local dir name kind exe failed=0
  while IFS=$'\t' read -r dir name kind exe; do
    local label="$(basename "$dir")/$name"
    [ "$kind" = test ] || label="$label ($kind)"
    timed "test: $label" run_test_binary "$dir" "$exe" "$label" || { failed=1; echo "$label" >>"$ci_out/failed.txt"; }
  done < <(python3 -c '
import json, os, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(os.path.dirname(m["manifest_path"]), m["target"]["name"], m["target"]["kind"][0], m["executable"], sep="\t")
' "$1")
  return $failed
}

ci_summary() {
  local rc=$?
  echo
  echo "ci: phases (wall seconds)"
  awk -F'\t' '{ printf "  %8.1f  %s\n", $1, $2 }' "$ci_out/phases.tsv"
  echo "ci: ten slowest tests (wall seconds)"
  sort -t$'\t' -k1,1 -rn "$ci_out/tests.tsv" | head -10 | awk -F'\t' '{ printf "  %8.1f  %s\n", $1, $2 }'
  [ ! -s "$ci_out/failed.txt" ] || { echo "ci: failed test binaries:"; sed 's/^/  /' "$ci_out/failed.txt"; }
  echo "ci: total $(ci_elapsed "$ci_start") s, exit $rc"
  local passed failed
  passed=$(grep -hoE '^test result: [A-Za-z]+\. [0-9]+ passed' "$ci_out"/test-*.log 2>/dev/null | awk '{ s += $4 } END { print s + 0 }')
  failed=$(grep -hoE '; [0-9]+ failed' "$ci_out"/test-*.log 2>/dev/null | awk '{ s += $2 } END { print s + 0 }')
  echo "tests: $passed passed, $failed failed"
}
trap ci_summary EXIT
