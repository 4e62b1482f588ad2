#!/usr/bin/env bash
# What a test costs the client and the server, and how the cost grows (issue #13), as root:
#  1. a 30 s rrul at the default 10 ms step through the lab's cable line shaped with CAKE at
#     the demo's advised rates (54/3.5 Mbit/s): client and server CPU (user+sys) and peak RSS;
#  2. the same line, tcp-down with 1, 8, 64 and 256 flows;
#  3. rrul with a sampling step of 100, 10 and 1 ms;
#  4. on loopback, 1, 10 and 50 concurrent rrul tests against one server, each paced by the
#     server's --max-rate (20 Mbit/s a test), so the cost is per test and not per byte.
# Not a test: this machine is noisy (2 cores); read the spread of repeated runs.
#   usage: scripts/bench-client.sh [SECONDS]   (load of the scaling runs; default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
for tool in python3 /usr/bin/time; do
  command -v $tool >/dev/null || { echo "bench: needs $tool (apt-get install python3 time)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "bench: needs root" >&2; exit 1; }
cargo build --release --quiet
bl=$PWD/target/release/bloatlab
tmp=$(mktemp -d)
srv=""
cleanup() {
  [ -n "$srv" ] && kill $srv 2>/dev/null || true
  wait 2>/dev/null || true
  $bl lab down benchc >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
limits=(--max-tests 64 --max-tests-per-ip 64 --max-flows 256 --max-connections 4096 --max-connections-per-ip 4096 --max-probe-pps 20000 --max-streams 16)
hz=$(getconf CLK_TCK)
cpu_s() { awk -v hz="$hz" '{print ($14+$15)/hz}' /proc/$1/stat; }
hwm_kb() { awk '/VmHWM/ {print $2}' /proc/$1/status; }

# Runs a command, prints "user sys maxrss_kB" of it (GNU time: a wrapper forked from a big
# interpreter would count the interpreter's pages in the child's peak RSS).
rusage() {
  /usr/bin/time -f "%U %S %M" -o "$tmp/time" "$@" >/dev/null 2>&1
  cat "$tmp/time"
}

# One test from the lab's client: a table row with the client's and the server's cost.
row() {
  local label=$1; shift
  local s0; s0=$(cpu_s $srv)
  read -r u s rss < <(rusage ip netns exec bl-benchc-client $bl test "$@" -q -o "$tmp/r.json.gz")
  local s1; s1=$(cpu_s $srv)
  local samples
  samples=$(python3 -c "import gzip,json; d=json.load(gzip.open('$tmp/r.json.gz')); print(sum(len(s['samples']) for s in d['series']))" 2>/dev/null || echo -)
  printf '%-28s %8.2f %8.2f %8.2f %10.1f %10.2f %10.1f %10s\n' "$label" "$u" "$s" "$(python3 -c "print($u+$s)")" "$(python3 -c "print($rss/1024)")" "$(python3 -c "print($s1-$s0)")" "$(python3 -c "print($(hwm_kb $srv)/1024)")" "$samples"
}
header() { printf '%-28s %8s %8s %8s %10s %10s %10s %10s\n' run "user s" "sys s" "CPU s" "RSS MB" "server s" "srv HWM MB" samples; }

$bl lab up cable --name benchc >/dev/null 2>&1
$bl lab set lan --lab benchc --dir down "qdisc=cake bandwidth 54000kbit docsis ingress" >/dev/null
$bl lab set lan --lab benchc --dir up "qdisc=cake bandwidth 3500kbit docsis" >/dev/null
ip netns exec bl-benchc-server $bl server -q --listen '[::]:9461' "${limits[@]}" >/dev/null 2>&1 &
srv=$!
sleep 1

echo "== 1. rrul, 30 s load after 5 s idle, 10 ms step, cable line with CAKE at 54/3.5 Mbit/s =="
header
for r in 1 2 3; do row "rrul 30 s (run $r)" rrul 10.77.1.2 -l 30; done

echo "== 2. tcp-down, ${secs} s, by flows (same line) =="
header
for n in 1 8 64 256; do row "tcp-down --flows $n" tcp-down 10.77.1.2 --flows $n -l "$secs"; done

echo "== 3. rrul, ${secs} s, by sampling step (same line) =="
header
for st in 0.1 0.01 0.001; do row "rrul --step $st" rrul 10.77.1.2 -l "$secs" --step $st; done

kill $srv; wait $srv 2>/dev/null || true
$bl lab down benchc >/dev/null 2>&1

echo "== 4. Concurrent rrul tests on loopback, ${secs} s each, server paced at 20 Mbit/s a test =="
$bl server -q --listen 127.0.0.1:19462 "${limits[@]}" --max-rate 20 >/dev/null 2>&1 &
srv=$!
sleep 1
printf '%-8s %14s %16s %14s %12s\n' tests "server CPU s" "server CPU s/test" "srv HWM MB" "completed"
for n in 1 10 50; do
  s0=$(cpu_s $srv)
  pids=()
  for i in $(seq $n); do
    $bl test rrul 127.0.0.1:19462 -l "$secs" --idle 2 -q --json -o "$tmp/c$i.json.gz" >"$tmp/c$i.sum" 2>/dev/null & pids+=($!)
  done
  ok=0
  for p in "${pids[@]}"; do wait $p && ok=$((ok + 1)) || true; done
  s1=$(cpu_s $srv)
  printf '%-8s %14.2f %16.3f %14.1f %12s\n' $n "$(python3 -c "print($s1-$s0)")" "$(python3 -c "print(($s1-$s0)/$n)")" "$(python3 -c "print($(hwm_kb $srv)/1024)")" "$ok/$n"
done
