#!/usr/bin/env bash
# Memory of `bloatlab autorate` over a long run: a bloatlab server and autorate at 20 probes a
# second in a network namespace this script makes (loopback probes, an HTB class on a veth and
# on its IFB, the line idle), with its log and /metrics face on (scraped once a minute, as
# Prometheus would). Every minute: RSS and PSS (/proc/PID/status, smaps_rollup) and the log's
# size; at the end the first, last and highest RSS and the growth per hour after the first 5
# minutes. With --in-monitor, autorate rides in `bloatlab monitor` (`--autorate FILE`, one
# process, one probe stream; the monitor's history and /metrics on too). Needs root and a
# release build; BLOATLAB_BIN runs another build (the router's: scripts/build-router.sh
# x86_64-unknown-linux-musl). Its CPU seconds are printed too (utime + stime).
#
#   scripts/soak-autorate.sh [MINUTES] [--in-monitor]      (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${BLOATLAB_BIN:-$PWD/target/release/bloatlab}")
minutes=${1:-60}
in_monitor=${2:-}
[ -z "$in_monitor" ] || [ "$in_monitor" = --in-monitor ] || { echo "unknown: $in_monitor" >&2; exit 2; }
[[ "$minutes" =~ ^[1-9][0-9]*$ ]] || { echo "MINUTES: a whole number from 1" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "needs root (network namespace)" >&2; exit 1; }
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
ns=soak-autorate-$$
tmp=$(mktemp -d /tmp/soak-autorate.XXXXXX)
cleanup() {
  set +e
  if [ -e "/run/netns/$ns" ]; then
    for p in $(ip netns pids "$ns"); do kill "$p" 2>/dev/null; done
    sleep 1
    for p in $(ip netns pids "$ns"); do kill -9 "$p" 2>/dev/null; done
    ip netns del "$ns"
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$ns"
ip -n "$ns" link set lo up
ip -n "$ns" link add wan type veth peer name wan-peer
ip -n "$ns" link add ifb4wan type ifb
for d in wan wan-peer ifb4wan; do ip -n "$ns" link set "$d" up; done
for d in wan ifb4wan; do
  tc -n "$ns" qdisc add dev "$d" root handle 1: htb default 1
  tc -n "$ns" class add dev "$d" parent 1: classid 1:1 htb quantum 1514 rate 40mbit
done
ip netns exec "$ns" "$bin" server --listen 127.0.0.1:9461 -q 2>"$tmp/server.err" &
for _ in $(seq 50); do
  ip netns exec "$ns" ss -Hlun 'sport = :9461' | grep -q . && break
  sleep 0.1
done
if [ -n "$in_monitor" ]; then
  cat >"$tmp/autorate.toml" <<TOML
dev = "wan"
down = "5mbit:40mbit:80mbit"
up = "2mbit:40mbit:80mbit"
probe_rate = 20
log = "$tmp/autorate.jsonl"
TOML
  ip netns exec "$ns" "$bin" monitor 127.0.0.1:9461 --every 0 --iface wan --db "$tmp/history.db" \
    --out-dir "$tmp/results" --metrics 127.0.0.1:9466 --autorate "$tmp/autorate.toml" \
    2>"$tmp/autorate.err" &
else
  ip netns exec "$ns" "$bin" autorate 127.0.0.1:9461 --dev wan --down 5mbit:40mbit:80mbit \
    --up 2mbit:40mbit:80mbit --probe-rate 20 --log "$tmp/autorate.jsonl" \
    --metrics 127.0.0.1:9466 2>"$tmp/autorate.err" &
fi
pid=$!
# RSS is anonymous memory (heap, stacks) and file pages (the binary's code as its paths run,
# SQLite's shared WAL index): only the first can leak.
echo "minute  RSS kB  anon kB  file kB  PSS kB  log kB  CPU s"
hz=$(getconf CLK_TCK)
rss=()
for m in $(seq 0 "$minutes"); do
  [ "$m" = 0 ] || sleep 60
  kill -0 "$pid" 2>/dev/null || { echo "autorate ended:" >&2; cat "$tmp/autorate.err" >&2; exit 1; }
  ip netns exec "$ns" curl -s -o /dev/null http://127.0.0.1:9466/metrics || true
  r=$(awk '$1 == "VmRSS:" { print $2 }' "/proc/$pid/status")
  anon=$(awk '$1 == "RssAnon:" { print $2 }' "/proc/$pid/status")
  file=$(awk '$1 == "RssFile:" || $1 == "RssShmem:" { s += $2 } END { print s }' "/proc/$pid/status")
  p=$(awk '$1 == "Pss:" { print $2 }' "/proc/$pid/smaps_rollup")
  l=$(( $(stat -c %s "$tmp/autorate.jsonl" 2>/dev/null || echo 0) / 1024 ))
  # utime and stime: fields 14 and 15 of /proc/PID/stat (the name, field 2, has no spaces here).
  cpu=$(awk -v hz="$hz" '{ printf "%.1f", ($14 + $15) / hz }' "/proc/$pid/stat")
  rss+=("$r $anon")
  printf '%6d %7d %8d %8d %7d %7d %6s\n' "$m" "$r" "$anon" "$file" "$p" "$l" "$cpu"
done
printf '%s\n' "${rss[@]}" | awk -v m="$minutes" '
  { v[NR - 1] = $1; a[NR - 1] = $2; if ($1 > max) max = $1 }
  END {
    from = (m > 5) ? 5 : 0
    printf "RSS: first %d kB, last %d kB, highest %d kB; after minute %d: %+.0f kB per hour",
      v[0], v[m], max, from, (v[m] - v[from]) * 60 / (m - from)
    printf " (anonymous: %+.0f kB per hour)\n", (a[m] - a[from]) * 60 / (m - from)
  }'
