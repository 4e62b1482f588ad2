#!/usr/bin/env bash
# Side-by-side with peers on loopback, in the same run: TCP goodput of bloatlab tcp-down against
# iperf3 (1 and 4 flows), idle probe RTT of bloatlab ping against irtt. Prints ratios; the
# numbers go into BENCHMARKS.md. Not a test: this machine is noisy, read the spread.
#   usage: scripts/bench-measure.sh [SECONDS]   (default 8 per run)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-8}
for tool in iperf3 irtt python3; do
  command -v $tool >/dev/null || { echo "bench: needs $tool (apt-get install iperf3 irtt)" >&2; exit 1; }
done
cargo build --release --quiet
bl=./target/release/bloatlab
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

$bl server --listen 127.0.0.1:19461 -q 2>/dev/null & pids+=($!)
iperf3 -s -B 127.0.0.1 -p 15201 >/dev/null 2>&1 & pids+=($!)
irtt server -b 127.0.0.1:12112 >/dev/null 2>&1 & pids+=($!)
sleep 1

json() { python3 -c "import json,sys; d=json.load(open('$1')); print($2)"; }

echo "== TCP goodput on loopback: median of 3 interleaved ${secs}s runs, first 2 s omitted by both =="
median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
printf '%-6s %12s %12s %7s   %s\n' flows bloatlab iperf3 ratio "runs (bloatlab / iperf3, Mbit/s)"
for n in 1 4; do
  bs=(); is=()
  for r in 1 2 3; do
    $bl test tcp-down 127.0.0.1:19461 --flows $n -l "$secs" --idle 1 --json -q -o "$tmp/bl.json" >"$tmp/bl.sum"
    # -R: the server sends, as in tcp-down.
    iperf3 -c 127.0.0.1 -p 15201 -R -P $n -t "$secs" -O 2 -J >"$tmp/ip.json"
    bs+=("$(json "$tmp/bl.sum" "round(d['throughput_mbps']['down'])")")
    is+=("$(json "$tmp/ip.json" "round(d['end']['sum_received']['bits_per_second']/1e6)")")
  done
  b=$(median "${bs[@]}"); i=$(median "${is[@]}")
  printf '%-6s %9.0f Mb %9.0f Mb %7.2f   %s / %s\n' $n "$b" "$i" "$(python3 -c "print($b/$i)")" "${bs[*]}" "${is[*]}"
done

echo "== Idle probe RTT on loopback, ${secs}s at 10 ms =="
$bl test ping 127.0.0.1:19461 -l "$secs" --idle 0 --json -q -o "$tmp/ping.json" >"$tmp/ping.sum"
irtt client -q -i 10ms -d "${secs}s" -l 64 -o "$tmp/irtt.json" 127.0.0.1:12112 >/dev/null
gzip -df "$tmp/irtt.json.gz" 2>/dev/null || true
read -r bp50 bp99 < <(json "$tmp/ping.sum" "d['latency_ms']['idle']['p50']*1e3, d['latency_ms']['idle']['p99']*1e3" | tr -d '(),')
read -r ip50 ip99 < <(python3 - "$tmp/irtt.json" <<'P'
import json, sys
d = json.load(open(sys.argv[1]))
r = sorted(x["delay"]["rtt"] / 1e3 for x in d["round_trips"] if x.get("delay", {}).get("rtt"))
q = lambda p: r[min(len(r) - 1, int(p * len(r)))]
print(q(0.50), q(0.99))
P
)
printf '%-6s %10s %10s %10s\n' "" bloatlab irtt diff
printf '%-6s %8.1fus %8.1fus %+8.1fus\n' p50 "$bp50" "$ip50" "$(python3 -c "print($bp50-$ip50)")"
printf '%-6s %8.1fus %8.1fus %+8.1fus\n' p99 "$bp99" "$ip99" "$(python3 -c "print($bp99-$ip99)")"
