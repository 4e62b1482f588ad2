#!/usr/bin/env bash
# The queue below the qdisc against its physics (issue #18 item 2): a 10 Mbit/s link with
# FQ-CoDel above a 256-entry driver ring, kept full by 12 Mbit/s of unresponsive UDP in
# 1500-byte IP packets. The probes beside the load (10 a second: few enough that the ring holds
# load packets) are FQ-CoDel's sparse flow, so the qdisc sends them next; what they still wait
# is the ring. Physics: the ring holds `held` bytes (256 x 1500, or with BQL its byte limit),
# which drain in held x 8 / rate (307.2 ms for 256 packets); the ring's own sojourn (lab stats)
# is that; a probe arriving at a random moment also waits on average half a 1.2 ms packet for a
# place in the ring.
#   usage: scripts/bench-ring.sh [SECONDS]   (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
. scripts/bench-lib.sh
bench_needs python3
bench_root
lab=blring
bench_start
in_lab() { local host=$1; shift; $bl lab exec --lab $lab "$host" -- "$@"; }
printf '%-8s %9s %9s %11s %12s %14s %9s %7s\n' ring "max pkts" "BQL B" "physics ms" "ring p50 ms" "(ratio)" "probes +ms" "(ratio)"
run() { # BQL: a fresh lab per run, so the ring's statistics are this run's
  cat > "$tmp/ring.toml" <<TOML
name = "$lab"
[[link]]
name = "wifi"
a = "client"
b = "server"
both = { rate = "10mbit", qdisc = "fq_codel", ring = 256, bql = "$1" }
TOML
  $bl lab down $lab >/dev/null 2>&1 || true
  $bl lab up "$tmp/ring.toml" >/dev/null 2>&1
  in_lab server $bl server -q >/dev/null 2>&1 &
  pids+=($!)
  sleep 1
  in_lab client $bl test udp 10.77.0.2 --rate "${RATE:-12}mbit" --size 1472 --pacing timer -l "$secs" --idle 2 --step 0.1 --json -q -o "$tmp/udp.json" > "$tmp/s.json" || true
  $bl lab stats --json --lab $lab > "$tmp/stats.json"
  python3 - "$1" "$tmp/s.json" "$tmp/stats.json" <<'PY'
import json, sys
bql, s, st = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
d = st["links"]["wifi"]["up"]
def q(buckets, f):
    total = sum(c for _, c in buckets); seen = 0
    for v, c in buckets:
        seen += c
        if seen >= f * total: return v
ring_p50 = q(d["ring_sojourn"]["us"], 0.5) / 1e3
limit = d.get("bql_limit_bytes")
held = limit if bql == "on" else d["max_ring_packets"] * 1500
physics = held * 8 / 10e6 * 1e3
probe = physics + 0.6
added = s["added_latency_ms"]
print(f"  (goodput {s['throughput_mbps']['up']:.2f} Mbit/s, mean packet {d['tx_bytes'] / d['tx_packets']:.0f} B on the link)", file=sys.stderr)
print(f"{'bql ' + bql:<8} {d['max_ring_packets']:9} {str(limit):>9} {physics:11.2f} {ring_p50:12.2f} {ring_p50 / physics:14.3f} {added:9.2f} {added / probe:7.3f}")
PY
  kill "${pids[-1]}" 2>/dev/null || true
}
run off
run on
