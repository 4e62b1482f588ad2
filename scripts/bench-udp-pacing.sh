#!/usr/bin/env bash
# Sender pacing through a shallow switch, bloatlab against iperf3 on the same emulated path
# (the lab's `switch` preset: gigabit host, 64 KB switch buffer on a 100 Mbit/s uplink, a
# 50 Mbit/s line). Each sender offers the same UDP payload rate in 1 KB datagrams; the table
# gives what arrived, the loss, and the packets the switch itself dropped (lab counters).
#   iperf3 -b spaces its sends by its --pacing-timer (1000 us by default since 3.x; the 100 ms
#   bursts of older releases are --pacing-timer 100000); bloatlab's --pacing timer,
#   timer:1ms and burst:100ms are the same three senders.
#   usage: scripts/bench-udp-pacing.sh [SECONDS] [RATE_MBIT]   (defaults 10 45)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}; rate=${2:-45}
. scripts/bench-lib.sh
bench_needs iperf3 python3
bench_root
lab=blpace
bench_start
$bl lab down $lab >/dev/null 2>&1 || true
$bl lab up switch --name $lab >/dev/null 2>&1
in_lab() { local host=$1; shift; $bl lab exec --lab $lab "$host" -- "$@"; }
in_lab server $bl server -q >/dev/null 2>&1 &
pids+=($!)
sleep 1
# The switch's drops, then those of the client's own TUN queue (the host, not the path).
drops() { $bl lab stats --json --lab $lab | python3 -c "import json,sys; l=json.load(sys.stdin)['links']; print(l['uplink']['up']['drops']['overflow'], l['lan']['up']['tun']['dropped'])"; }

printf '%-32s %10s %10s %8s %12s %10s %14s\n' sender "sent pkts" "Mbit/s rx" "loss %" "switch drops" "host drops" "send peak/mean"
row() { # NAME SENT RX_MBPS LOSS SWITCH_DROPS HOST_DROPS PEAK
  printf '%-32s %10s %10.2f %8.2f %12s %10s %14s\n' "$@"
}
iperf() { # LABEL PACING_TIMER_US
  local s0 h0 s1 h1 out
  read -r s0 h0 <<< "$(drops)"
  # A fresh server per run (-1 serves one test).
  in_lab server iperf3 -s -1 >/dev/null 2>&1 &
  sleep 0.5
  out=$(in_lab client iperf3 -c 10.77.2.2 -u -b "${rate}M" -l 1024 -t "$secs" --pacing-timer "$2" -J)
  read -r s1 h1 <<< "$(drops)"
  read -r sent rx loss <<< "$(python3 -c "import json,sys; e=json.loads(sys.argv[1])['end']['sum']; print(e['packets'], e['bits_per_second']*(1-e['lost_percent']/100)/1e6, e['lost_percent'])" "$out")"
  row "$1" "$sent" "$rx" "$loss" "$((s1 - s0))" "$((h1 - h0))" "-"
}
bloat() { # LABEL PACING
  local s0 h0 s1 h1 out
  read -r s0 h0 <<< "$(drops)"
  out=$(in_lab client $bl test udp 10.77.2.2 --rate "${rate}mbit" --pacing "$2" -l "$secs" --idle 1 --json -q -o "$tmp/udp.json")
  read -r s1 h1 <<< "$(drops)"
  read -r sent rx loss peak <<< "$(python3 -c "import json,sys; s=json.loads(sys.argv[1]); print(s['udp']['sent'], s['throughput_mbps']['up'], s['loss']['percent'], round(s['burst']['send']['peak_over_mean'], 1))" "$out")"
  row "$1" "$sent" "$rx" "$loss" "$((s1 - s0))" "$((h1 - h0))" "$peak"
}
iperf "iperf3 -b (pacing timer 1 ms)" 1000
iperf "iperf3 -b (pacing timer 100 ms)" 100000
bloat "bloatlab --pacing timer" timer
bloat "bloatlab --pacing timer:1ms" timer:1ms
bloat "bloatlab --pacing burst:100ms" burst:100ms
