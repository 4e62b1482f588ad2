#!/usr/bin/env bash
# The busy-hour finding, in the lab: the cable preset (60/4 Mbit/s, 1000-packet FIFOs, 15 ms),
# a monitor on its router watching the WAN device (probes only), and a household download from
# the client for ON seconds of every PERIOD (by default 60 of 180: the issue's 10 minutes of
# every 30, a third of the time, scaled down). Prints the history per minute and load band:
# the busy minutes carry the download's queue (full, 1000 * 1514 * 8 / 60e6 = 202 ms), the idle
# ones do not. Needs root (the lab) and a release build.
#
#   scripts/bench-monitor-busy.sh [PERIODS] [ON] [PERIOD]      # default 3 60 180
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release/bloatlab
periods=${1:-3}
on=${2:-60}
period=${3:-180}
lab=busyhour
work=$(mktemp -d /tmp/bench-busy.XXXXXX)
cleanup() {
  [ -n "${mon:-}" ] && kill -TERM "$mon" 2>/dev/null && wait "$mon" 2>/dev/null
  "$bin" lab down "$lab" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
"$bin" lab up cable --name "$lab" >/dev/null
x() { "$bin" lab exec --lab "$lab" "$@"; }
x server -- "$bin" server -q 2>/dev/null &
sleep 1
x router -- "$bin" monitor 10.77.1.2 --every 0 --probe-rate 5 --iface wan \
  --db "$work/h.db" --out-dir "$work/res" 2>"$work/monitor.log" &
mon=$!
echo "$(date -u +%T) monitor on the router; household download ${on} s of every ${period} s, ${periods} times"
for ((i = 0; i < periods; i++)); do
  x client -- "$bin" test tcp-down 10.77.1.2 -l "$on" --idle 1 -q -o "$work/dl-$i.json.gz" \
    >/dev/null 2>&1 || true
  echo "$(date -u +%T) download $((i + 1)) done"
  sleep $((period - on - 3))
done
kill -TERM "$mon"
wait "$mon" || true
mon=
python3 - "$work/h.db" <<'EOF'
import json, sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
rows = db.execute("select minute, load, sent, lost, rtt, rx_mbps from minutes "
                  "where testing = 0 order by minute, load").fetchall()
print("minute (UTC)  load   probes  lost  rtt p50 ms  p90 ms   wan rx Mbit/s")
pool = {}
for minute, load, sent, lost, rtt, rx in rows:
    q = json.loads(rtt) if rtt else {}
    import time
    print(f"{time.strftime('%H:%M', time.gmtime(minute))}         {load:<6} {sent:6d} {lost:5d}"
          f"  {q.get('p50', float('nan')):10.1f} {q.get('p90', float('nan')):7.1f}   {rx:8.1f}")
hist = {}
for load, h in db.execute("select load, rtt_hist from minutes where testing = 0"):
    for us, n in json.loads(h):
        hist.setdefault(load, []).extend([us / 1000] * n)
print("over the whole run:")
for load, v in sorted(hist.items()):
    v.sort()
    q = lambda p: v[min(len(v) - 1, int(p * len(v)))]
    print(f"  {load:<6} {len(v):6d} answered probes  p50 {q(0.5):7.1f} ms  p90 {q(0.9):7.1f} ms  "
          f"p99 {q(0.99):7.1f} ms")
EOF
