#!/usr/bin/env bash
# Every parser of untrusted input under libFuzzer, each target for SECONDS (default 10; an hour
# a target finds what CI's mutations cannot), from its corpus and the seeds in fuzz/seeds. Each
# target calls its case in crates/fuzz-cases, whose tests (CI's) run it on the seeds and 4000
# mutations of them. Installs cargo-fuzz when it is missing; one build serves every target.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      FUZZ_JOBS=N: N targets at a time (default 1)
#                                              FUZZ_SLOW_UNIT_S=N: an input that takes N s of
#                                              wall time is kept as a slow unit (default 10)
#                                              FUZZ_SANITIZER=address: under AddressSanitizer
#                                              (default none)
#
# No sanitizer by default: the parsers are safe Rust (bounds checked, no `unsafe` in them), so
# a bad index panics and libFuzzer reports it as a crash either way; AddressSanitizer would add
# a third to the build (535 -> 346 CPU s without it) and slow every input. It still helps for
# the dependencies' own `unsafe` (str0m's, the SDP parser's): FUZZ_SANITIZER=address.
#
# A crash fails the run, names the target and leaves the input in fuzz/artifacts/TARGET: turn
# it into a regression test beside the code it broke. Under .ci/run (its `timed` exported) the
# build and each target are timed as phases.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-10}
shift || true
case "$seconds" in '' | *[!0-9]*) echo "fuzz.sh: SECONDS must be whole seconds, got '$seconds'" >&2; exit 2 ;; esac
jobs=${FUZZ_JOBS:-1}
slow=${FUZZ_SLOW_UNIT_S:-10}
case "$slow" in '' | 0 | *[!0-9]*) echo "fuzz.sh: FUZZ_SLOW_UNIT_S must be whole seconds, got '$slow'" >&2; exit 2 ;; esac
case "$jobs" in '' | 0 | *[!0-9]*) echo "fuzz.sh: FUZZ_JOBS must be a positive count, got '$jobs'" >&2; exit 2 ;; esac
declare -F timed >/dev/null || timed() { shift; "$@"; }

if ! command -v cargo-fuzz >/dev/null; then
  timed "fuzz: install cargo-fuzz" cargo install cargo-fuzz --locked --quiet
fi
export RUSTC_BOOTSTRAP=1 # cargo fuzz's -Z flags on the stable toolchain
sanitizer=${FUZZ_SANITIZER:-none}
timed "fuzz: build" cargo fuzz build --sanitizer "$sanitizer"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)

# One target from its corpus and seeds; its output is printed whole when it ends.
fuzz_target() {
  local target=$1 seeds=() log
  [ -d "seeds/$target" ] && seeds=("seeds/$target")
  mkdir -p "corpus/$target"
  log=$(mktemp)
  # libFuzzer's own lines are thousands; keep its verdict and any crash.
  timed "fuzz: $target ${seconds} s" bash -c 'cargo fuzz run --sanitizer "$0" "$@" 2>&1 | grep -E "^Done|SUMMARY|panicked" || true' "$sanitizer" \
    "$target" "corpus/$target" "${seeds[@]}" -- -max_total_time="$seconds" \
    -report_slow_units="$slow" >"$log" 2>&1
  cat "$log"
  rm -f "$log"
  if [ -n "$(ls -A "artifacts/$target" 2>/dev/null)" ]; then
    echo "fuzz: $target crashed: fuzz/artifacts/$target" >&2
    return 1
  fi
}
export -f fuzz_target
declare -F timed >/dev/null && export -f timed
export seconds slow sanitizer
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'fuzz_target "$1"' _ {}
