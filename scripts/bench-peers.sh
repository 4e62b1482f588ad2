#!/usr/bin/env bash
# bloatlab side by side with its peers on one kernel bottleneck, in the same run:
#   client - router - server network namespaces, HTB 20 Mbit/s down / 5 Mbit/s up with a pfifo
#   of LIMIT packets on the router's egress (a shaper on a sender's own interface would hide
#   the bloat), congestion control pinned in both end namespaces.
# Per LIMIT, one after the other on the same line:
#   rrul:     bloatlab rrul            | flent rrul (netperf + irtt + ping)
#   bidir:    bloatlab tcp-bidir -f 8  | crusader's bidirectional phase (8 streams)
#   download: bloatlab tcp-down -f 1   | irtt (10 ms) during an iperf3 -R download
# and prints loaded RTT p50/p90 and goodput each way, with the ratio bloatlab/peer.
#
#   scripts/bench-peers.sh [--out DIR] [--length S] [--cc ALGO] [--limits "1000 30"]
#                          [--tests "rrul bidir download"]
#
# Needs root, iperf3, irtt, flent (apt-get install flent irtt iperf3 fping), netperf built with
# --enable-demo (flent's requirement) and crusader's CLI built from source, on PATH or in
# $PEERS_BIN (see BENCHMARKS.md for how they were built).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BLOATLAB:-$PWD/target/release/bloatlab}
out=bench-peers-out
length=20
cc=cubic
limits="1000 30"
tests="rrul bidir download"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --length) length=$2; shift 2 ;;
    --cc) cc=$2; shift 2 ;;
    --limits) limits=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "bench-peers: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "${PEERS_BIN:-}" ] && export PATH="$PEERS_BIN:$PATH"
[ "$(id -u)" = 0 ] || { echo "bench-peers: needs root (network namespaces)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "bench-peers: build first (cargo build --release)" >&2; exit 1; }
for tool in iperf3 irtt flent netperf netserver crusader python3 tc; do
  command -v $tool >/dev/null || { echo "bench-peers: $tool not found (PATH or \$PEERS_BIN)" >&2; exit 1; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd -P)

P=bp
CLI=${P}cli RTR=${P}rtr SRV=${P}srv SRV_ADDR=10.99.3.1
# allow $cc for the bench's duration (topo3_up), then restore the list.
allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
. "$(dirname "$0")/topo3-lib.sh"
# Whatever stops the bench: end the servers, delete the namespaces, restore the sysctl.
cleanup() {
  topo3_remove
  sysctl -qw net.ipv4.tcp_allowed_congestion_control="$allowed" || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

topology_up() {
  topo3_up "$cc"
  in_ns $SRV "$BIN" server -q >/dev/null 2>&1 &
  in_ns $SRV netserver -D >/dev/null 2>&1 &
  in_ns $SRV irtt server -b $SRV_ADDR >/dev/null 2>&1 &
  in_ns $SRV iperf3 -s >/dev/null 2>&1 &
  (cd "$out" && in_ns $SRV crusader serve >/dev/null 2>&1) &
  sleep 1
}


bloatlab() { # name test args...
  local name=$1; shift
  in_ns $CLI "$BIN" test "$@" $SRV_ADDR --cc $cc -q --json -o "$out/$name.json.gz" > "$out/$name.summary.json"
}

for LIMIT in $limits; do
  echo "== pfifo $LIMIT" >&2
  topology_up
  topo3_shape "$LIMIT"
  want() { case " $tests " in *" $1 "*) return 0 ;; esac; return 1; }
  if want rrul; then
  echo "  rrul: bloatlab, flent" >&2
  with_queues "$out/rrul.$LIMIT.bloatlab.queues" bloatlab "rrul.$LIMIT.bloatlab" rrul -l "$length" --idle 5
  with_queues "$out/rrul.$LIMIT.flent.queues" in_ns $CLI flent rrul -H $SRV_ADDR -l "$length" -D "$out" -t "pfifo$LIMIT" -f summary > "$out/rrul.$LIMIT.flent.txt" 2>&1 || echo "  flent failed: $(tail -n1 "$out/rrul.$LIMIT.flent.txt")" >&2
  mv "$(ls -t "$out"/rrul-*pfifo$LIMIT*.flent.gz | head -n1)" "$out/rrul.$LIMIT.flent.gz" 2>/dev/null || true
  fi
  if want bidir; then
  echo "  bidirectional, 8 flows each way: bloatlab, crusader" >&2
  bloatlab "bidir.$LIMIT.bloatlab" tcp-bidir --flows 8 -l "$length" --idle 5
  rm -rf "$out/crusader-results"
  (cd "$out" && in_ns $CLI crusader test $SRV_ADDR --bidirectional --streams 8 --load-duration "$length" --out-name "bidir$LIMIT") > "$out/bidir.$LIMIT.crusader.txt" 2>&1 || echo "  crusader failed: $(tail -n1 "$out/bidir.$LIMIT.crusader.txt")" >&2
  crr=$(ls "$out"/crusader-results/bidir$LIMIT*.crr 2>/dev/null | head -n1)
  [ -n "$crr" ] && crusader export "$crr" -o "$out/bidir.$LIMIT.crusader.json" -f >/dev/null 2>&1 || true
  fi
  if want download; then
  echo "  one download flow: bloatlab, irtt during iperf3" >&2
  bloatlab "down.$LIMIT.bloatlab" tcp-down --flows 1 -l "$length" --idle 5
  in_ns $CLI iperf3 -c $SRV_ADDR -R -t $((length + 2)) -C $cc -J > "$out/down.$LIMIT.iperf3.json" 2>&1 &
  ip3=$!
  sleep 2
  in_ns $CLI irtt client -i 10ms -d "${length}s" -q -o "$out/down.$LIMIT.irtt.json" $SRV_ADDR >/dev/null 2>&1 || true
  wait $ip3 || true
  fi
done

python3 - "$out" "$length" $limits <<'PY'
import gzip, json, os, statistics, sys
out, length, limits = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
def load(p):
    try:
        return json.load(gzip.open(p) if p.endswith(".gz") else open(p))
    except Exception:
        return None
def pct(v, q):
    v = sorted(x for x in v if x is not None)
    if not v: return None
    i = q * (len(v) - 1); lo = int(i); hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (i - lo)
def bl(name):
    s = load(f"{out}/{name}.summary.json")
    if not s: return None
    l = s["latency_ms"]["loaded"] or {}
    return {"down": s["throughput_mbps"]["down"], "up": s["throughput_mbps"]["up"], "p50": l.get("p50"), "p90": l.get("p90")}
def flent(limit):
    d = load(f"{out}/rrul.{limit}.flent.gz")
    if not d: return None
    x, r = d["x_values"], d["results"]
    # Load from 5 s to 5 s + length; leave out its first min(2 s, 20 %), as bloatlab does.
    a, b = 5 + min(2, 0.2 * length), 5 + length
    pick = lambda name: [v for t, v in zip(x, r.get(name, [])) if a <= t <= b and v is not None]
    lat = pick("Ping (ms) ICMP") + pick("Ping (ms) UDP BE") + pick("Ping (ms) UDP BK") + pick("Ping (ms) UDP EF")
    mean = lambda v: statistics.mean(v) if v else None
    return {"down": mean(pick("TCP download sum")), "up": mean(pick("TCP upload sum")), "p50": pct(lat, .5), "p90": pct(lat, .9)}
def irtt(limit):
    d = load(f"{out}/down.{limit}.irtt.json")
    i = load(f"{out}/down.{limit}.iperf3.json")
    if not d: return None
    rtts = [rt["delay"]["rtt"] / 1e6 for rt in d.get("round_trips", []) if rt.get("delay", {}).get("rtt")]
    down = i["end"]["sum_received"]["bits_per_second"] / 1e6 if i and "end" in i else None
    return {"down": down, "up": None, "p50": pct(rtts, .5), "p90": pct(rtts, .9)}
def crusader(limit):
    # From crusader's raw data (its export): the bidirectional phase, less its first
    # min(2 s, 20 %) as bloatlab and crusader itself trim; pings every 5 ms.
    d = load(f"{out}/bidir.{limit}.crusader.json")
    if not d: return None
    sec = lambda v: v["secs"] + v["nanos"] / 1e9
    ph = [p for p in d["test_data"] if p["kind"] == "Bidirectional"] or d["test_data"]
    # The phase's record runs on past the load (its grace period): the load is load_duration.
    a = sec(ph[0]["start"])
    b = min(sec(ph[0]["end"]), a + sec(d["config"]["load_duration"]))
    a += min(2.0, 0.2 * (b - a))
    lat = [sec(p["latency"]["total"]) * 1e3 for p in d["pings"] if p.get("latency") and p["latency"].get("total") and a <= sec(p["sent"]) <= b]
    def bytes_at(stream, t):
        prev = 0
        for x in stream["data"]:
            if sec(x["time"]) > t: break
            prev = x["bytes"]
        return prev
    rate = {True: 0.0, False: 0.0}
    for g in d["stream_groups"]:
        if not g["both"]: continue
        for st in g["streams"]:
            rate[g["download"]] += (bytes_at(st, b) - bytes_at(st, a)) * 8 / (b - a) / 1e6
    return {"down": rate[True], "up": rate[False], "p50": pct(lat, .5), "p90": pct(lat, .9)}
def queues(name):
    # The router's pfifos as a probe crossing both would find them: bytes over each rate (HTB
    # counts the Ethernet frame, as the backlog does), over the span the queues were in use,
    # less its first min(2 s, 20 %) as for the tools.
    p = f"{out}/{name}.queues"
    if not os.path.exists(p): return None
    # tc prints a backlog near a multiple of 1024 as "30Kb" (the sampler cut the "b"); such
    # samples were once skipped.
    size = lambda x: float(x[:-1]) * {"K": 1024, "M": 1 << 20}[x[-1]] if x[-1:] in ("K", "M") else float(x)
    rows = []
    for line in open(p):
        f = line.split()
        if len(f) == 3:
            rows.append((float(f[0]), size(f[1]) * 8 / 20e6 * 1e3 + size(f[2]) * 8 / 5e6 * 1e3))
    busy = [t for t, d in rows if d > 0]
    if not busy: return None
    a, b = busy[0], busy[-1]
    a += min(2.0, 0.2 * (b - a))
    d = [x for t, x in rows if a <= t <= b]
    return {"down": None, "up": None, "p50": pct(d, .5), "p90": pct(d, .9)}
fmt = lambda v: f"{'-':>8}" if v is None else f"{v:8.1f}"
ratio = lambda a, b: f"{'-':>6}" if a is None or not b else f"{a / b:6.2f}"
print("loaded RTT (ms) and goodput (Mbit/s), the same line in one run; ratio = bloatlab / peer;")
print("'queues': the delay the router's two FIFOs held (sampled every 0.1 s) while that tool ran")
print(f"{'line':10} {'test':9} {'tool':10} {'down':>8} {'up':>8} {'RTT p50':>8} {'RTT p90':>8}   ratios: down     up    p50    p90")
for limit in limits:
    for test, blname, peer, pname in (("rrul", f"rrul.{limit}.bloatlab", flent(limit), "flent"),
                                      ("bidir", f"bidir.{limit}.bloatlab", crusader(limit), "crusader"),
                                      ("download", f"down.{limit}.bloatlab", irtt(limit), "irtt+iperf3")):
        b = bl(blname)
        for tool, v in (("bloatlab", b), (pname, peer)):
            if v is None:
                print(f"pfifo {limit:<4} {test:9} {tool:10} (no result)")
                continue
            line = f"pfifo {limit:<4} {test:9} {tool:10} {fmt(v['down'])} {fmt(v['up'])} {fmt(v['p50'])} {fmt(v['p90'])}"
            if tool != "bloatlab" and b:
                line += "        " + " ".join(ratio(b[k], v[k]) for k in ("down", "up", "p50", "p90"))
            print(line)
        if test == "rrul":
            for tool in ("bloatlab", "flent"):
                q = queues(f"rrul.{limit}.{tool}")
                if q:
                    print(f"pfifo {limit:<4} {test:9} {'  queues':10} {fmt(None)} {fmt(None)} {fmt(q['p50'])} {fmt(q['p90'])}   (the router's FIFOs during {tool}'s run)")
PY
