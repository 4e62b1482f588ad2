# Sourced by benchmark scripts: the checks and the set-up they share.

# bench_needs TOOL...: stop with a message unless each is installed.
bench_needs() {
  for t; do command -v "$t" >/dev/null || { echo "bench: needs $t (apt-get install $t)" >&2; exit 1; }; done
}

# bench_root [WHY]: stop unless root.
bench_root() {
  [ "$(id -u)" = 0 ] || { echo "bench: needs root${1:+ ($1)}" >&2; exit 1; }
}

# bench_start: builds once and sets $bl (the binary), $tmp (a directory) and $pids (background
# processes); on exit the processes are killed, the lab named $lab (if set) is taken down and
# $tmp removed.
bench_start() {
  cargo build --release --quiet
  bl=$PWD/target/release/bloatlab
  tmp=$(mktemp -d)
  pids=()
  trap bench_cleanup EXIT
}

bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${lab:-}" ]; then $bl lab down "$lab" >/dev/null 2>&1 || true; fi
  rm -rf "$tmp"
}
