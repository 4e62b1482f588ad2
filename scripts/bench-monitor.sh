#!/usr/bin/env bash
# What `bloatlab monitor` costs, side by side in one run with smokeping_prober-style idle
# probing at the same rate: the monitor (light probes only, --every 0, --iface lo) at 5 probes
# a second, `fping -l -p 200` and `irtt client -i 200ms`, all to loopback at once for SECONDS.
# Prints each one's CPU seconds and peak RSS, scaled to an hour, and the history's growth per
# day. Needs fping and irtt (Debian's packages) and a release build.
#
#   scripts/bench-monitor.sh [SECONDS]          # default 600
#   scripts/bench-monitor.sh --soak N           # N short scheduled tests back to back (ping,
#                                               # 0.3 s): the monitor's RSS every 50 tests
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/bloatlab
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
work=$(mktemp -d /tmp/bench-monitor.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# CPU seconds (user + system) and peak RSS (kB) of a running process.
cost() {
  local pid=$1 tck
  tck=$(getconf CLK_TCK)
  awk -v t="$tck" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$pid/stat"
  printf ' '
  awk '/^VmHWM:/ { printf "%d\n", $2 }' "/proc/$pid/status"
}
rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

"$bin" server --listen 127.0.0.1:9471 -q 2>/dev/null &
pids+=($!)
sleep 0.5

if [ "${1:-}" = --soak ]; then
  n=${2:?--soak needs a count}
  "$bin" monitor 127.0.0.1:9471 --every 500ms --test "ping --idle 0" -l 0.3 --probe-rate 5 \
    --iface lo --db "$work/soak.db" --out-dir "$work/results" 2>"$work/soak.log" &
  mon=$!
  pids+=($mon)
  echo "tests  rss_kB  (monitor, --every 500ms, ping -l 0.3 --idle 0)"
  next=0
  while :; do
    done_n=$(grep -c " s: grade " "$work/soak.log" || true)
    if [ "$done_n" -ge "$next" ]; then
      printf '%5d  %6d\n' "$done_n" "$(rss $mon)"
      next=$((next + 50))
    fi
    [ "$done_n" -ge "$n" ] && break
    kill -0 $mon 2>/dev/null || { echo "the monitor died:" >&2; tail "$work/soak.log" >&2; exit 1; }
    sleep 1
  done
  echo "peak RSS $(awk '/^VmHWM:/ { print $2 }' /proc/$mon/status) kB; history $(du -k "$work/soak.db" | cut -f1) kB"
  exit 0
fi

secs=${1:-600}
command -v fping >/dev/null && command -v irtt >/dev/null \
  || { echo "needs fping and irtt: apt-get install fping irtt" >&2; exit 1; }
irtt server -b 127.0.0.1:2112 >/dev/null 2>&1 &
pids+=($!)
sleep 0.3
"$bin" monitor 127.0.0.1:9471 --every 0 --probe-rate 5 --iface lo --db "$work/h.db" \
  --out-dir "$work/results" 2>"$work/monitor.log" &
mon=$!
pids+=($mon)
fping -l -p 200 -q 127.0.0.1 >/dev/null 2>&1 &
fp=$!
pids+=($fp)
irtt client -i 200ms -d "$((secs + 30))s" -Q 127.0.0.1:2112 &
ir=$!
pids+=($ir)
sleep $((secs - 5))
echo "over ${secs} s, 5 probes/s to loopback, side by side:"
printf '%-32s %10s %10s %14s\n' "" "CPU s" "peak kB" "CPU s per hour"
for p in "monitor:$mon" "fping -l -p 200:$fp" "irtt client -i 200ms:$ir"; do
  name=${p%%:*}
  read -r cpu hwm < <(cost "${p##*:}")
  printf '%-32s %10s %10s %14.1f\n' "$name" "$cpu" "$hwm" "$(echo "$cpu * 3600 / $secs" | bc -l)"
done
# The history's size per minute row, its log folded in (a copy: the monitor still writes).
cp "$work/h.db" "$work/copy.db"
[ -f "$work/h.db-wal" ] && cp "$work/h.db-wal" "$work/copy.db-wal"
python3 - "$work/copy.db" <<'EOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("pragma wal_checkpoint(truncate)")
rows, probes = db.execute("select count(*), sum(sent) from minutes").fetchone()
size = db.execute("pragma page_count").fetchone()[0] * db.execute("pragma page_size").fetchone()[0]
hist = db.execute("select avg(length(rtt_hist)) from minutes").fetchone()[0]
print(f"history: {rows} minute rows, {probes} probes, {size} bytes (schema included); "
      f"rtt_hist {hist:.0f} bytes a row")
EOF
