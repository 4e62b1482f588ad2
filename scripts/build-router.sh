#!/usr/bin/env bash
# The router build: one static (musl) bloatlab for an OpenWrt-class device, as small as it gets.
#
#   scripts/build-router.sh TARGET [--features LIST] [--dev] [--check]
#   scripts/build-router.sh --prepare [TARGET]   (its tools, and TARGET's prebuilt std where
#                                               rustup has one, for --dev: CI fetches them
#                                               beside its build)
#
# TARGET: aarch64-unknown-linux-musl, armv7-unknown-linux-musleabihf, x86_64-unknown-linux-musl
# (mipsel-unknown-linux-musl is tried the same way; see BENCHMARKS.md for what it gives).
# --features adds to the router's set (`https`, `browser`, `report`, `lab`: Cargo.toml of
# crates/cli says what each costs). The binary lands in target/TARGET/router/bloatlab; its size
# is printed. --check then runs it (qemu-user for another CPU) against this machine's own
# bloatlab: --version, `test ping`, `test rrul-be -l 3` to a server on loopback, and `config
# tc-cake` byte for byte against the host's (target/release/bloatlab, or $BLOATLAB). --dev builds
# the same features unoptimized (profile router-dev, target/TARGET/router-dev/bloatlab), on
# rustup's prebuilt std for the target where it is installed: half the CPU and less, for CI's
# check that they build for the target and run, not for a router.
#
# How (each saves what a router's flash and RAM pay for):
# - the C parts (ring, SQLite) cross-compile with zig's C compiler for the target's musl
#   (cargo-zigbuild; both from PyPI, installed here when missing): no cross gcc, no sysroot;
# - std is built from source with the binary (-Zbuild-std, through RUSTC_BOOTSTRAP on the stable
#   toolchain: the one toolchain here), optimized for size with panic=abort and no unwinding
#   tables, where the prebuilt std carries both; the same route serves targets rustup has no
#   std for (armv7 musl is not served by this mirror, mipsel is tier 3);
# - SQLite without the extensions the monitor's history never uses (full-text search, R-trees,
#   JSON, loadable extensions, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

tools() {
  command -v cargo-zigbuild >/dev/null && python3 -m ziglang version >/dev/null 2>&1 ||
    python3 -m pip install --quiet --disable-pip-version-check ziglang==0.17.1 cargo-zigbuild==0.24.1
  rustup component list --installed 2>/dev/null | grep -q '^rust-src' || rustup component add rust-src
}
if [ "${1:-}" = --prepare ]; then
  tools
  # rustup serves aarch64's musl std, not armv7's (nor mipsel's, tier 3).
  [ -z "${2:-}" ] || rustup target add "$2" 2>/dev/null || true
  exit 0
fi

target=${1:?usage: scripts/build-router.sh TARGET [--features LIST] [--dev] [--check]}
shift
features=router
check=0
profile=router
while [ $# -gt 0 ]; do
  case $1 in
    --features) features="router,${2:?--features needs a list}"; shift 2 ;;
    --check) check=1; shift ;;
    --dev) profile=router-dev; shift ;;
    *) echo "build-router: unknown argument $1" >&2; exit 2 ;;
  esac
done

tools

# SQLite's bundled build turns these on; the history needs none of them (-U after their -D).
sqlite_off="-USQLITE_ENABLE_FTS3 -USQLITE_ENABLE_FTS3_PARENTHESIS -USQLITE_ENABLE_FTS5
  -USQLITE_ENABLE_RTREE -USQLITE_ENABLE_DBSTAT_VTAB -USQLITE_ENABLE_STAT4 -USQLITE_SOUNDEX
  -USQLITE_ENABLE_COLUMN_METADATA -USQLITE_ENABLE_LOAD_EXTENSION -DSQLITE_OMIT_LOAD_EXTENSION
  -DSQLITE_OMIT_JSON -DSQLITE_OMIT_DEPRECATED -DSQLITE_OMIT_SHARED_CACHE
  -DSQLITE_OMIT_PROGRESS_CALLBACK -DSQLITE_OMIT_COMPLETE -DSQLITE_DEFAULT_MEMSTATUS=0"

export RUSTC_BOOTSTRAP=1
export LIBSQLITE3_FLAGS="${sqlite_off//$'\n'/ }"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
# No unwinding tables (nothing unwinds: panic=abort), no source paths in panic messages.
# zig brings musl (crt objects and libc) for every target, rustup's std component or not.
# RUSTFLAGS from outside come first (CI's -D warnings).
export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C force-unwind-tables=no -Z location-detail=none -C link-self-contained=no"
# 32-bit ARM: Thumb-2, as the thumbv7 targets are, a fifth smaller than ARM code.
case $target in armv7-*) RUSTFLAGS="$RUSTFLAGS -C target-feature=+thumb-mode" ;; esac
# std from source, optimized for size; for --dev rustup's prebuilt one where it is installed
# (std, core and compiler-builtins built unoptimized: 248 CPU s for the check, 214 without).
build_std=(-Z build-std=std,panic_abort -Z build-std-features=optimize_for_size)
if [ $profile = router-dev ] && rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  build_std=()
fi
cargo zigbuild --locked --profile "$profile" --target "$target" -p bloatlab \
  --no-default-features --features "$features" \
  "${build_std[@]}"

bin=$CARGO_TARGET_DIR/$target/$profile/bloatlab
size=$(stat -c %s "$bin")
echo "build-router: $bin: $size bytes ($(awk -v s="$size" 'BEGIN { printf "%.2f", s / 1048576 }') MiB), features $features"

[ $check = 1 ] || exit 0
case $target in
  aarch64-*) runner=(qemu-aarch64-static) ;;
  armv7-*) runner=(qemu-arm-static) ;;
  # A router's MIPS core (24Kc: no FPU, as the soft-float target assumes); qemu's default is not one.
  mipsel-*) runner=(qemu-mipsel-static -cpu 24Kc) ;;
  x86_64-*) runner=() ;;
  *) echo "build-router: no runner known for $target" >&2; exit 2 ;;
esac
if [ ${#runner[@]} -gt 0 ] && ! command -v "${runner[0]}" >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static >/dev/null
  else
    echo "build-router: ${runner[0]} missing (Debian's qemu-user-static)" >&2; exit 1
  fi
fi
host=${BLOATLAB:-target/release/bloatlab}
[ -x "$host" ] || { echo "build-router: --check needs $host (cargo build --release, or BLOATLAB=PATH)" >&2; exit 1; }
tmp=$(mktemp -d)
server_pid=
cleanup() {
  [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
run() { "${runner[@]}" "$bin" "$@"; }

run --version
"$host" server --listen 127.0.0.1:0 -q >"$tmp/server.out" 2>&1 &
server_pid=$!
for _ in $(seq 100); do
  port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$tmp/server.out")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { cat "$tmp/server.out" >&2; echo "build-router: the server did not start" >&2; exit 1; }
run test ping "127.0.0.1:$port" -l 2 -q -o "$tmp/ping.json"
# Data moved: the download counts what it reads. (Under qemu-user the upload reads 0, and the
# result's notes say why: its TCP_INFO comes back with 4 of the kernel's 168 bytes. The same
# build on x86_64, natively, counts its upload.) When it did not, what the result file says of
# the flows, the phases and the run's events.
if ! run test rrul-be "127.0.0.1:$port" -l 3 -q -o "$tmp/rrul.json" | tee "$tmp/rrul.txt" ||
  ! awk '/^Throughput/ { ok = ($4 + 0 > 0) } END { exit !ok }' "$tmp/rrul.txt"; then
  python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
for k in ("flows", "phases", "params"):
    print(k, json.dumps(r["metadata"].get(k)))
print("events", json.dumps(r.get("events")))' "$tmp/rrul.json" >&2 || true
  echo "build-router: rrul-be moved no data down" >&2; exit 1
fi
# The cross build wrote result files the host build reads (one format, whatever the CPU).
"$host" advise "$tmp/rrul.json" >/dev/null
args=(config tc-cake --dev wan --down 50mbit --up 10mbit)
cmp <(run "${args[@]}") <("$host" "${args[@]}")
echo "build-router: $target runs: ping, rrul-be against the host's server, config as the host's"
