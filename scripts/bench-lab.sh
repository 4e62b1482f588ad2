#!/usr/bin/env bash
# Lab emulator benchmarks, same run, same machine (root):
#  1. unshaped forwarding through one emulated link: TCP Gbit/s (iperf3), packets/s, and the
#     emulator's CPU per Gbit/s;
#  2. shaped: bloatlab's link model against the kernel's own htb+pfifo at the same rate and
#     buffer, 4 TCP flows: goodput and latency under load.
#   usage: scripts/bench-lab.sh [SECONDS] [RATE_MBIT] [FIFO_PACKETS]   (defaults 10 50 100)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}; rate=${2:-50}; limit=${3:-100}
for tool in iperf3 python3 ip tc; do
  command -v $tool >/dev/null || { echo "bench: needs $tool" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "bench: needs root" >&2; exit 1; }
cargo build --release --quiet
bl=$PWD/target/release/bloatlab
tmp=$(mktemp -d)
cleanup() {
  $bl lab down --all >/dev/null 2>&1 || true
  # A deleted namespace lives on around its processes: end them first.
  for n in blbench-a blbench-b blbench-c blbench-r blbench-s; do
    pids=$(ip netns pids $n 2>/dev/null || true)
    if [ -n "$pids" ]; then
      kill $pids 2>/dev/null || true
      for _ in $(seq 50); do kill -0 $pids 2>/dev/null || break; sleep 0.1; done
      kill -9 $pids 2>/dev/null || true
    fi
    ip netns del $n 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
$bl lab down --all >/dev/null 2>&1 || true

cpu_ticks() { awk '{print $14+$15}' /proc/$1/stat; }
lab_pid() { python3 -c "import json; print(json.load(open('/run/bloatlab/labs/$1/info.json'))['pid'])"; }
tx_packets() { $bl lab stats --json --lab $1 | python3 -c "import json,sys; d=json.load(sys.stdin)['links']['l']; print(d['up']['tx_packets']+d['down']['tx_packets'])"; }
tun_stats() { $bl lab stats --json --lab $1 | python3 -c "import json,sys; d=json.load(sys.stdin)['links']['l']; print(sum(d[x]['tun']['dropped'] for x in ('up','down')), max(d[x]['tun']['wait_us']['p99'] for x in ('up','down')))"; }
hz=$(getconf CLK_TCK)

echo "== 1. Unshaped forwarding through one emulated link (${secs}s iperf3 runs), against a bare copy loop =="
# `raw`: crates/lab/examples/tun_copy.rs, two threads copying between two TUN devices with no
# model (the yardstick); `lab`: one emulated link, no shaping. Each with and without
# super-packets (offload). TUN: packets the devices' own transmit queues (before the model)
# dropped, and the p99 time a packet waited there (the queue outside the model).
cargo build --release --quiet -p bloatlab-lab --example tun_copy
raw_copy=$PWD/target/release/examples/tun_copy
for n in blbench-a blbench-b; do ip netns add $n; ip -n $n link set lo up; done
printf '%-14s %-6s %10s %10s %10s %14s %10s %12s\n' forwarder flows Gbit/s kpps "CPU %" "CPU s per Gbit" "TUN drops" "TUN wait p99"
declare -A gbps_of
measure() { # NAME FLOWS PID CLIENT_NS SERVER_ADDR [LAB]
  local name=$1 n=$2 pid=$3 cns=$4 dst=$5 lab=${6:-} c0 c1 p0=0 p1=0 d0=0 d1=0 w1=0 gbps
  if [ -n "$lab" ]; then p0=$(tx_packets $lab); read -r d0 _ <<< "$(tun_stats $lab)"; fi
  c0=$(cpu_ticks $pid)
  gbps=$(ip netns exec $cns iperf3 -c $dst -t "$secs" -P $n -J | python3 -c "import json,sys; print(json.load(sys.stdin)['end']['sum_received']['bits_per_second']/1e9)")
  c1=$(cpu_ticks $pid)
  if [ -n "$lab" ]; then p1=$(tx_packets $lab); read -r d1 w1 <<< "$(tun_stats $lab)"; fi
  gbps_of[$name/$n]=$gbps
  python3 - "$name" "$n" "$gbps" "$c0" "$c1" "$p0" "$p1" "$hz" "$secs" "$((d1 - d0))" "$w1" <<'P'
import sys
name, n, g, c0, c1, p0, p1, hz, secs, drops, wait = sys.argv[1], sys.argv[2], float(sys.argv[3]), *map(float, sys.argv[4:])
cpu = (c1 - c0) / hz / secs * 100
kpps = f"{(p1-p0)/secs/1e3:10.0f}" if p1 else f"{'-':>10}"
print(f"{name:<14} {n:<6} {g:10.2f} {kpps} {cpu:10.0f} {cpu/100/g:14.2f} {drops:10.0f} {wait:9.0f} us")
P
}
for off in false true; do
  flag=$([ $off = true ] && echo --offload || true)
  $raw_copy blbench-a blbench-b $flag >/dev/null & rpid=$!
  sleep 0.5
  printf 'name="fwd"\noffload=%s\n[[link]]\nname="l"\na="c"\nb="s"\n' $off >"$tmp/fwd.toml"
  $bl lab up "$tmp/fwd.toml" 2>/dev/null
  pid=$(lab_pid fwd)
  ns_c=bl-fwd-c  # the lab names its namespaces bl-LAB-HOST
  for n in 1 4; do
    ip netns exec blbench-b iperf3 -s -D -1 >/dev/null 2>&1; sleep 0.3
    measure "raw offload=$off" $n $rpid blbench-a 10.78.0.2
    $bl lab exec s -- iperf3 -s -D -1 >/dev/null 2>&1 || true; sleep 0.3
    measure "lab offload=$off" $n $pid "$ns_c" 10.77.0.2 fwd
  done
  $bl lab down fwd >/dev/null 2>&1
  kill $rpid; wait $rpid 2>/dev/null || true
done
for n in 1 4; do
  python3 -c "import sys; l, r = map(float, sys.argv[2:]); print(f'{sys.argv[1]} flow(s): the lab with super-packets forwards {l/r:.2f}x the bare super-packet loop')" $n "${gbps_of[lab offload=true/$n]}" "${gbps_of[raw offload=true/$n]}"
done

echo "== 1a. Shaped at 1 Gbit/s with FQ-CoDel: one packet per syscall and per wake-up (as before super-packets) against now =="
printf '%-34s %-6s %10s %10s %14s\n' setting flows Gbit/s "CPU %" "CPU s per Gbit"
for setting in "offload=false rx_usecs=0" "offload=true rx_usecs=100"; do
  printf 'name="g"\n%s\n[[link]]\nname="l"\na="c"\nb="s"\nboth = { rate = "1gbit", qdisc = "fq_codel" }\n' "${setting// /$'\n'}" >"$tmp/g.toml"
  $bl lab up "$tmp/g.toml" 2>/dev/null
  pid=$(lab_pid g)
  for n in 1 4; do
    $bl lab exec s -- iperf3 -s -D -1 >/dev/null 2>&1 || true; sleep 0.3
    c0=$(cpu_ticks $pid)
    gbps=$($bl lab exec c -- iperf3 -c 10.77.0.2 -t "$secs" -P $n -J | python3 -c "import json,sys; print(json.load(sys.stdin)['end']['sum_received']['bits_per_second']/1e9)")
    c1=$(cpu_ticks $pid)
    python3 -c "import sys; s, n, g, c0, c1, hz, secs = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:]); cpu = (c1 - c0) / hz / secs * 100; print(f'{s:<34} {n:<6} {g:10.3f} {cpu:10.0f} {cpu/100/g:14.2f}')" "$setting" $n "$gbps" "$c0" "$c1" "$hz" "$secs"
  done
  $bl lab down g >/dev/null 2>&1
done

echo "== 1b. The qdisc's cost at 1 Gbit/s: FIFO, CoDel, FQ-CoDel and CAKE, 4 TCP flows, same run =="
# FIFO behind the link's 1 Gbit/s serialiser; CAKE (diffserv3, triple-isolate) shaping at
# 1 Gbit/s itself on an unlimited link. Packets per second and the emulator's CPU per packet.
printf '%-6s %10s %10s %10s %16s\n' qdisc Gbit/s kpps "CPU %" "CPU us per pkt"
declare -A kpps_of
for q in fifo codel fq_codel cake; do
  case $q in
    cake) both='{ qdisc = "cake bandwidth 1gbit" }' ;;
    *) both="{ rate = \"1gbit\", limit = 1000, qdisc = \"$q\" }" ;;
  esac
  printf 'name="cost"\n[[link]]\nname="l"\na="c"\nb="s"\nboth = %s\n' "$both" >"$tmp/cost.toml"
  $bl lab up "$tmp/cost.toml" 2>/dev/null
  $bl lab exec s -- iperf3 -s -D -1 >/dev/null 2>&1 || true
  sleep 0.3
  pid=$(lab_pid cost)
  c0=$(cpu_ticks $pid); p0=$(tx_packets cost)
  gbps=$($bl lab exec c -- iperf3 -c 10.77.0.2 -t "$secs" -P 4 -J | python3 -c "import json,sys; print(json.load(sys.stdin)['end']['sum_received']['bits_per_second']/1e9)")
  c1=$(cpu_ticks $pid); p1=$(tx_packets cost)
  out=$(python3 - "$q" "$gbps" "$c0" "$c1" "$p0" "$p1" "$hz" "$secs" <<'P'
import sys
q, g, c0, c1, p0, p1, hz, secs = sys.argv[1], float(sys.argv[2]), *map(float, sys.argv[3:])
cpu = (c1 - c0) / hz / secs * 100
pps = (p1 - p0) / secs
print(f"{q:<6} {g:10.2f} {pps/1e3:10.0f} {cpu:10.0f} {cpu/100/pps*1e6:16.2f}")
P
)
  echo "$out"
  kpps_of[$q]=$(echo "$out" | awk '{print $3}')
  $bl lab down cost >/dev/null 2>&1
done
python3 -c "import sys; f, c = map(float, sys.argv[1:]); print(f'CAKE forwards {c/f:.2f}x the packets per second of FIFO')" "${kpps_of[fifo]}" "${kpps_of[cake]}"

echo "== 1c. Chains: 1, 3 and 6 unshaped links in a row, 1 TCP flow =="
# Every link is a forwarder of its own (two threads), so the chain's rate is the slowest hop's
# and its CPU grows with the hops: CPU s per Gbit against hops.
printf '%-6s %10s %10s %16s\n' links Gbit/s "CPU %" "CPU s per Gbit"
for hops in 1 3 6; do
  python3 - "$hops" >"$tmp/chain.toml" <<'P'
import sys
n = int(sys.argv[1])
hosts = ["c"] + [f"r{i}" for i in range(1, n)] + ["s"]
print('name="chain"')
for i in range(n):
    print(f'[[link]]\nname="l{i}"\na="{hosts[i]}"\nb="{hosts[i+1]}"')
P
  $bl lab up "$tmp/chain.toml" 2>/dev/null
  $bl lab exec s -- iperf3 -s -D -1 >/dev/null 2>&1 || true
  sleep 0.3
  pid=$(lab_pid chain)
  dst=$($bl lab exec s -- ip -4 -o addr show | awk '$2 != "lo" {sub("/.*", "", $4); print $4; exit}')
  c0=$(cpu_ticks $pid)
  gbps=$($bl lab exec c -- iperf3 -c "$dst" -t "$secs" -J | python3 -c "import json,sys; print(json.load(sys.stdin)['end']['sum_received']['bits_per_second']/1e9)")
  c1=$(cpu_ticks $pid)
  python3 -c "import sys; h, g, c0, c1, hz, secs = sys.argv[1], *map(float, sys.argv[2:]); cpu = (c1 - c0) / hz / secs * 100; print(f'{h:<6} {g:10.2f} {cpu:10.0f} {cpu/100/g:16.2f}')" "$hops" "$gbps" "$c0" "$c1" "$hz" "$secs"
  $bl lab down chain >/dev/null 2>&1
done

echo "== 2. Shaped at ${rate} Mbit/s with a ${limit}-packet FIFO: bloatlab lab vs kernel htb+pfifo =="
# The kernel's htb counts Ethernet frames (IP + 14 bytes): give the lab the same overhead.
printf 'name="shp"\n[[link]]\nname="l"\na="c"\nb="s"\nboth = { rate = "%smbit", limit = %s, overhead = 14 }\n' "$rate" "$limit" >"$tmp/shp.toml"
$bl lab up "$tmp/shp.toml" 2>/dev/null
$bl lab exec s -- $bl server -q >/dev/null 2>&1 &
sleep 0.5
$bl lab exec c -- $bl test tcp-down 10.77.0.2 --flows 4 --cc cubic -l "$secs" --idle 2 --json -q -o "$tmp/lab.json" >"$tmp/lab.sum"
$bl lab down shp >/dev/null 2>&1

for n in c r s; do ip netns add blbench-$n; ip -n blbench-$n link set lo up; done
ip link add c0 netns blbench-c type veth peer name rc netns blbench-r
ip link add s0 netns blbench-s type veth peer name rs netns blbench-r
ip -n blbench-c addr add 10.98.2.1/24 dev c0; ip -n blbench-r addr add 10.98.2.254/24 dev rc
ip -n blbench-s addr add 10.98.3.1/24 dev s0; ip -n blbench-r addr add 10.98.3.254/24 dev rs
for pair in c:c0 r:rc r:rs s:s0; do
  ns=blbench-${pair%%:*}; dev=${pair#*:}
  ip -n $ns link set dev $dev gso_max_size 1514 gso_max_segs 1 up
  ip netns exec $ns ethtool -K $dev tso off gso off gro off >/dev/null 2>&1 || true
done
ip -n blbench-c route add default via 10.98.2.254
ip -n blbench-s route add default via 10.98.3.254
ip netns exec blbench-r sysctl -qw net.ipv4.ip_forward=1
ip netns exec blbench-r tc qdisc add dev rc root handle 1: htb default 1
ip netns exec blbench-r tc class add dev rc parent 1: classid 1:1 htb rate ${rate}mbit
ip netns exec blbench-r tc qdisc add dev rc parent 1:1 handle 10: pfifo limit "$limit"
ip netns exec blbench-s $bl server -q >/dev/null 2>&1 &
sleep 0.5
ip netns exec blbench-c $bl test tcp-down 10.98.3.1 --flows 4 --cc cubic -l "$secs" --idle 2 --json -q -o "$tmp/htb.json" >"$tmp/htb.sum"

python3 - "$tmp/lab.sum" "$tmp/htb.sum" "$rate" "$limit" <<'P'
import json, sys
lab, htb = (json.load(open(p)) for p in sys.argv[1:3])
rate, limit = float(sys.argv[3]), int(sys.argv[4])
full = limit * 1514 * 8 / (rate * 1e6) * 1e3
print(f"(a full FIFO is {limit} x 1514 B at {rate:g} Mbit/s = {full:.1f} ms)")
print(f"{'':24} {'bloatlab lab':>14} {'kernel htb':>14} {'ratio':>8}")
for name, path in [("goodput, Mbit/s", ("throughput_mbps", "down")), ("idle RTT p50, ms", ("latency_ms", "idle", "p50")),
                   ("loaded RTT p50, ms", ("latency_ms", "loaded", "p50")), ("loaded RTT p99, ms", ("latency_ms", "loaded", "p99"))]:
    a, b = lab, htb
    for k in path:
        a, b = a[k], b[k]
    print(f"{name:24} {a:14.2f} {b:14.2f} {a/b:8.2f}")
P
