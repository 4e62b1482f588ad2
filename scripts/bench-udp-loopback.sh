#!/usr/bin/env bash
# Paced UDP at 100 Mbit/s on loopback, bloatlab against iperf3 -b in the same run (issue #18:
# rate within 1% of the target, the 1 ms rate's p99 at most 1.1x its mean and its peak at most
# 1.5x). One referee for both senders: tcpdump on lo, nanosecond stamps of every 1 KB datagram
# as the kernel sent it, bucketed per ms over the load (first and last 100 ms left out). CPU is
# the sender process's user + system time over the load's length. bloatlab's own sender and
# receiver profiles (burst.send, burst.recv) are printed beside the capture's.
#   usage: scripts/bench-udp-loopback.sh [SECONDS] [RATE_MBIT]   (defaults 10 100)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}; rate=${2:-100}
. scripts/bench-lib.sh
bench_needs iperf3 tcpdump python3
bench_root tcpdump
bench_start
$bl server --listen 127.0.0.1:9471 -q >/dev/null 2>&1 &
pids+=($!)
sleep 0.5

# capture PORT FILE: tcpdump of the datagrams of over 1000 bytes to PORT; prints its pid.
capture() {
  tcpdump -i lo -n -s 64 --time-stamp-precision=nano -w "$2" "udp and dst port $1 and greater 1000" >/dev/null 2>&1 &
  echo $!
}
# profile FILE: payload Mbit/s and the 1 ms buckets' p99 and peak over their mean.
profile() {
  python3 - "$1" "$rate" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
magic = struct.unpack("<I", data[:4])[0]
assert magic == 0xa1b23c4d, "want a nanosecond pcap"
t, off = [], 24
while off + 16 <= len(data):
    sec, nsec, incl, orig = struct.unpack("<IIII", data[off:off + 16])
    t.append((sec * 1_000_000_000 + nsec, orig))
    off += 16 + incl
t0, t1 = t[0][0] + 100_000_000, t[-1][0] - 100_000_000
inside = [(ts, n) for ts, n in t if t0 <= ts < t1]
# orig is the frame on lo: 14 bytes of Ethernet header, 20 of IPv4 and 8 of UDP before the payload.
payload = sum(n - 42 for _, n in inside)
mbps = payload * 8 / ((t1 - t0) / 1e9) / 1e6
buckets = [0] * ((t1 - t0) // 1_000_000)
for ts, n in inside:
    i = (ts - t0) // 1_000_000
    if i < len(buckets):
        buckets[i] += n
mean = sum(buckets) / len(buckets)
s = sorted(buckets)
print(f"{len(t)} {mbps:.2f} {(mbps / float(sys.argv[2]) - 1) * 100:+.2f} {s[int(0.99 * (len(s) - 1))] / mean:.2f} {s[-1] / mean:.2f}")
PY
}
# cpu_of CMD...: runs CMD, its stdout to $tmp/out; prints its user + system seconds.
cpu_of() {
  local t
  t=$( { TIMEFORMAT='%U %S'; time "$@" > "$tmp/out" 2>/dev/null; } 2>&1 )
  python3 -c "import sys; u, s = map(float, sys.argv[1].split()); print(f'{u + s:.2f}')" "$t"
}

printf '%-30s %9s %10s %8s %10s %10s %8s %s\n' sender packets "Mbit/s" "vs rate" "p99/mean" "peak/mean" "CPU s" "(own profile: send p99/peak, recv p99/peak)"
iperf() { # LABEL PACING_TIMER_US
  iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
  local srv=$!
  sleep 0.5
  local cap cpu
  cap=$(capture 5299 "$tmp/i.pcap")
  sleep 0.5
  cpu=$(cpu_of iperf3 -c 127.0.0.1 -p 5299 -u -b "${rate}M" -l 1024 -t "$secs" --pacing-timer "$2")
  sleep 0.3
  kill -INT "$cap"; wait "$cap" 2>/dev/null || true; wait "$srv" 2>/dev/null || true
  read -r n mbps off p99 peak <<< "$(profile "$tmp/i.pcap")"
  printf '%-30s %9s %10s %7s%% %10s %10s %8s\n' "$1" "$n" "$mbps" "$off" "$p99" "$peak" "$cpu"
}
bloat() { # LABEL PACING
  local cap cpu own
  cap=$(capture 9471 "$tmp/b.pcap")
  sleep 0.5
  cpu=$(cpu_of $bl test udp 127.0.0.1:9471 --rate "${rate}mbit" --size 1024 --pacing "$2" -l "$secs" --idle 1 --json -q -o "$tmp/udp.json")
  sleep 0.3
  kill -INT "$cap"; wait "$cap" 2>/dev/null || true
  read -r n mbps off p99 peak <<< "$(profile "$tmp/b.pcap")"
  own=$(python3 -c "import json; b=json.load(open('$tmp/out'))['burst']; print(f\"{b['send']['p99_over_mean']:.2f}/{b['send']['peak_over_mean']:.2f}, {b['recv']['p99_over_mean']:.2f}/{b['recv']['peak_over_mean']:.2f}\")")
  printf '%-30s %9s %10s %7s%% %10s %10s %8s (%s)\n' "$1" "$n" "$mbps" "$off" "$p99" "$peak" "$cpu" "$own"
}
iperf "iperf3 -b (1 ms pacing timer)" 1000
bloat "bloatlab --pacing timer" timer
bloat "bloatlab --pacing timer:1ms" timer:1ms
