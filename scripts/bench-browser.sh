#!/usr/bin/env bash
# The browser test against the CLI on one kernel bottleneck (client - router - server
# namespaces, HTB + pfifo on the router's egress, as ../shared/samples/topo3-kernel-htb.sh):
# headless Chromium runs the page (http://SERVER:8080/?autostart=1), then `bloatlab test
# tcp-down` and `tcp-up` run on the same path; prints each phase's added latency p50 beside the
# CLI's and their ratio, and each side's probe loss under load.
#
#   scripts/bench-browser.sh [--length S] [--probes webrtc|websocket] [--cc NAME] [LIMIT:DOWN:UP ...]
#     (defaults: 30 s, webrtc (the page's own choice), this machine's default congestion
#     control, 30:20mbit:5mbit 1000:20mbit:5mbit)
#
# Needs root, chromium, and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(pwd)/target/release/bloatlab
length=30
probes=webrtc
cc=
configs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --length) length=$2; shift 2 ;;
    --probes) probes=$2; shift 2 ;;
    --cc) cc="congctl $2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) configs+=("$1"); shift ;;
  esac
done
[ ${#configs[@]} -gt 0 ] || configs=(30:20mbit:5mbit 1000:20mbit:5mbit)
[ -x "$BIN" ] || { echo "bench-browser: build first (cargo build --release)" >&2; exit 1; }
command -v chromium >/dev/null || { echo "bench-browser: needs chromium" >&2; exit 1; }
P=bbr
work=$(mktemp -d /tmp/bloatlab-bench-browser.XXXXXX)
cleanup() {
  pkill -f "user-data-dir=$work" 2>/dev/null || true
  for n in cli rtr srv; do ip netns del $P$n 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for n in cli rtr srv; do ip netns add $P$n; ip -n $P$n link set lo up; done
ip link add c0 netns ${P}cli type veth peer name rc netns ${P}rtr
ip link add s0 netns ${P}srv type veth peer name rs netns ${P}rtr
ip -n ${P}cli addr add 10.99.2.1/24 dev c0; ip -n ${P}rtr addr add 10.99.2.254/24 dev rc
ip -n ${P}srv addr add 10.99.3.1/24 dev s0; ip -n ${P}rtr addr add 10.99.3.254/24 dev rs
for p in "cli c0" "rtr rc" "rtr rs" "srv s0"; do set -- $p
  # TCP builds 64 KB software-GSO packets unless capped; a pfifo would count each as one.
  ip -n $P$1 link set $2 gso_max_size 1514 gso_max_segs 1 up
done
ip -n ${P}cli route add default via 10.99.2.254 $cc
ip -n ${P}srv route add default via 10.99.3.254 $cc
ip netns exec ${P}rtr sysctl -qw net.ipv4.ip_forward=1
ip netns exec ${P}srv "$BIN" server -q --http 8080 --ws 8081 --keep-web-results "$work/kept" > "$work/server.log" 2>&1 &
sleep 0.5

query=
[ "$probes" = websocket ] && query="&probes=websocket"
printf "%-22s %-6s %9s %9s %9s %9s %9s %9s %9s %9s %s\n" config phase page_ms cli_ms ratio page_mbps cli_mbps page_loss cli_loss grade "(page: overall, transport)"
for c in "${configs[@]}"; do
  IFS=: read -r limit down up <<< "$c"
  for spec in "rc $down" "rs $up"; do set -- $spec
    ip netns exec ${P}rtr tc qdisc del dev $1 root 2>/dev/null || true
    ip netns exec ${P}rtr tc qdisc add dev $1 root handle 1: htb default 1
    ip netns exec ${P}rtr tc class add dev $1 parent 1: classid 1:1 htb rate $2
    ip netns exec ${P}rtr tc qdisc add dev $1 parent 1:1 handle 10: pfifo limit "$limit"
  done
  rm -f "$work/kept"/web-*.json.gz
  # TMPDIR: Chromium's own temporary directories outlive the killed browser; they go with $work.
  TMPDIR="$work" ip netns exec ${P}cli chromium --headless=new --no-sandbox --disable-gpu --no-first-run --user-data-dir="$work/profile" \
    "http://10.99.3.1:8080/?autostart=1&length=$length$query" > "$work/browser.log" 2>&1 &
  for _ in $(seq $((length * 3 + 90))); do ls "$work/kept"/web-*.json.gz > /dev/null 2>&1 && break; sleep 1; done
  pkill -f "user-data-dir=$work" || true
  page=$(ls "$work/kept"/web-*.json.gz 2>/dev/null | head -1 || true)
  [ -n "$page" ] || { echo "$c: the page stored no result; server log:" >&2; cat "$work/server.log" >&2; continue; }
  for t in tcp-down tcp-up; do
    ip netns exec ${P}cli "$BIN" test $t 10.99.3.1 -l "$length" -q --json -o "$work/$t.json" > "$work/$t.summary.json"
  done
  python3 - "$c" "$page" "$work/tcp-down.summary.json" "$work/tcp-up.summary.json" <<'PY'
import gzip, json, sys
c, page, down, up = sys.argv[1:]
full = json.load(gzip.open(page))
p = full["summary"]
cli = {"download": json.load(open(down)), "upload": json.load(open(up))}
transport = full["metadata"]["params"].get("probe_transport", "websocket")
rtt = next(s for s in full["series"] if s["name"].startswith("rtt "))["samples"]
def page_loss(phase):
    # As the summary counts a phase: its probes after the first 2 s (or fifth).
    ph = next(x for x in full["metadata"]["phases"] if x["name"] == phase)
    skip = min(2.0, 0.2 * (ph["end"] - ph["start"]))
    w = [v for t, v in rtt if ph["start"] + skip <= t <= ph["end"]]
    return 100.0 * sum(v is None for v in w) / max(1, len(w))
for phase, d in (("download", "down"), ("upload", "up")):
    pm, cm = p["phase_added_latency_ms"][phase], cli[phase]["added_latency_ms"]
    ratio = pm / cm if pm is not None and cm else float("nan")
    cl = cli[phase]["loss"].get("load_percent")
    print("%-22s %-6s %9.1f %9.1f %9.2f %9.2f %9.2f %9.1f %9s %9s %s" % (c, d, pm, cm, ratio, p["throughput_mbps"][d], cli[phase]["throughput_mbps"][d], page_loss(phase), "-" if cl is None else "%.1f" % cl, p["grade_by_direction"][d] + "/" + cli[phase]["grade"], p["grade"] + ", " + transport))
print("%-22s %-6s %9.1f %9s" % (c, "both", p["phase_added_latency_ms"]["both"], "-"))
PY
done
