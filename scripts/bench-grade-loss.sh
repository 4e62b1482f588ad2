#!/usr/bin/env bash
# The grade of a short FIFO that drops instead of delaying (issue #38): `test tcp-up` through a
# kernel bottleneck whose upstream is HTB at RATE over a pfifo of LIMIT packets (client - router
# - server namespaces, cubic), RUNS times. Prints per run the added latency, the probes lost
# under load, the grade the latency alone gives and the grade after the loss cap.
#
#   scripts/bench-grade-loss.sh [--runs N] [--limit PACKETS] [--rate 6mbit] [-l SECONDS]
#
# Needs root and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BLOATLAB:-$PWD/target/release/bloatlab}
runs=3
limit=10
rate=6mbit
length=10
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    -l) length=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "bench-grade-loss: unknown option $1" >&2; exit 2 ;;
  esac
done

P=bgl
CLI=${P}cli RTR=${P}rtr SRV=${P}srv SRV_ADDR=10.99.3.1
allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
. "$(dirname "$0")/topo3-lib.sh"
topo3_require bench-grade-loss
tmp=$(mktemp -d)
cleanup() {
  topo3_remove
  sysctl -qw net.ipv4.tcp_allowed_congestion_control="$allowed" || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

topo3_up cubic
topo3_shape 1000
# The upstream: RATE over LIMIT packets (the download side keeps topo3's 20 Mbit/s).
in_ns $RTR tc class change dev rs parent 1: classid 1:1 htb rate "$rate"
in_ns $RTR tc qdisc change dev rs parent 1:1 handle 10: pfifo limit "$limit"
in_ns $SRV "$BIN" server -q --listen "$SRV_ADDR:9461" >"$tmp/server.log" 2>&1 &
sleep 1
echo "tcp-up through a $limit-packet FIFO at $rate, $runs runs of $length s"
printf '%-4s %10s %12s %10s %14s %6s\n' run "added ms" "load loss %" "goodput" "latency grade" grade
for i in $(seq 1 "$runs"); do
  in_ns $CLI "$BIN" test tcp-up "$SRV_ADDR" -l "$length" --idle 2 --cc cubic --json -q \
    -o "$tmp/run$i.json" >"$tmp/run$i.out"
  jq -r --arg i "$i" '[$i, (.added_latency_ms | . * 10 | round / 10),
      (.loss.load_percent | . * 10 | round / 10), (.throughput_mbps.up | . * 100 | round / 100),
      (.grade_loss_cap.latency_grade // .grade), .grade] | @tsv' "$tmp/run$i.out" |
    awk -F'\t' '{ printf "%-4s %10s %12s %10s %14s %6s\n", $1, $2, $3, $4, $5, $6 }'
done
