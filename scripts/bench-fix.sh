#!/usr/bin/env bash
# `bloatlab fix` on a kernel bottleneck, RUNS times (issue #39): client - router - server
# namespaces, HTB DOWN / UP over pfifos of LIMIT packets on the router (the "modem"), cubic;
# the fix goes on the client's c0 (the interface towards the modem) and ifb4c0. Per run: kept
# or not, rrul's added latency and download before and after, and whether `tune rollback`
# restored `tc -j qdisc show` exactly.
#
#   scripts/bench-fix.sh [--runs N] [--limit PACKETS] [--down 35mbit] [--up 7mbit] [-l SECONDS]
#
# Needs root, jq and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BLOATLAB:-$PWD/target/release/bloatlab}
runs=5
limit=600
down=35mbit
up=7mbit
length=10
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --down) down=$2; shift 2 ;;
    --up) up=$2; shift 2 ;;
    -l) length=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "bench-fix: unknown option $1" >&2; exit 2 ;;
  esac
done

P=bfx
CLI=${P}cli RTR=${P}rtr SRV=${P}srv SRV_ADDR=10.99.3.1
allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
. "$(dirname "$0")/topo3-lib.sh"
topo3_require bench-fix
tmp=$(mktemp -d)
cleanup() {
  "$BIN" tune rollback --dev c0 --netns $CLI >/dev/null 2>&1 || true
  topo3_remove
  sysctl -qw net.ipv4.tcp_allowed_congestion_control="$allowed" || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

topo3_up cubic
topo3_shape "$limit"
in_ns $RTR tc class change dev rc parent 1: classid 1:1 htb rate "$down"
in_ns $RTR tc class change dev rs parent 1: classid 1:1 htb rate "$up"
in_ns $SRV "$BIN" server -q --listen "$SRV_ADDR:9461" >"$tmp/server.log" 2>&1 &
sleep 1
echo "bloatlab fix through $limit-packet FIFOs at $down / $up, $runs runs, rrul of $length s"
printf '%-4s %-5s %10s %10s %7s %12s %12s %9s\n' run kept "before ms" "after ms" ratio "down before" "down after" rollback
for i in $(seq 1 "$runs"); do
  before=$(in_ns $CLI tc -j qdisc show)
  "$BIN" fix "$SRV_ADDR" --dev c0 --netns $CLI -l "$length" --json -q --out-dir "$tmp/run$i" \
    >"$tmp/run$i.json" 2>"$tmp/run$i.err" || true
  restored=-
  if [ "$(jq -r .kept "$tmp/run$i.json")" = true ]; then
    "$BIN" tune rollback --dev c0 --netns $CLI >/dev/null 2>&1
    [ "$(in_ns $CLI tc -j qdisc show)" = "$before" ] && restored=exact || restored=DIFFERS
  fi
  jq -r --arg i "$i" --arg r "$restored" '[$i, .kept,
      (.before.added_latency_ms | . * 10 | round / 10), (.after.added_latency_ms // 0 | . * 10 | round / 10),
      ((.before.added_latency_ms / (.after.added_latency_ms // 1e9)) | . * 10 | round / 10),
      (.before.throughput_mbps.down | . * 10 | round / 10), (.after.throughput_mbps.down // 0 | . * 10 | round / 10), $r] | @tsv' \
    "$tmp/run$i.json" | awk -F'\t' '{ printf "%-4s %-5s %10s %10s %7s %12s %12s %9s\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
done
