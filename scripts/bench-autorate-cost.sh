#!/usr/bin/env bash
# What keeping a shaper's rate right costs, side by side in one run: cake-autorate itself
# (lynxthecat/cake-autorate, bash + fping) at its defaults, and `bloatlab autorate --probe-rate
# 20`, both probing only inside a network namespace this script makes (loopback). After 10 s to
# settle, for SECONDS (default 600) it counts each one's CPU seconds (user + system, all its
# processes: cake-autorate's bash subshells, fping, tc, ...) and peak RSS, and prints them per
# hour with the ratio. Needs root, fping, git and a release build.
#
#   scripts/bench-autorate-cost.sh [SECONDS] [--icmp]
#   (--icmp: bloatlab pings the same 30 reflectors as cake-autorate, six at a time, instead of
#   probing its server: ICMP against ICMP)
#   CAKE_AUTORATE=DIR scripts/bench-autorate-cost.sh   # a cake-autorate checkout or bare git
#                                                      # dir (default: the local mirror below)
#
# cake-autorate's defaults (defaults.sh): pinger_method=fping, no_pingers=6,
# reflector_ping_interval_s=0.3, so one fping pings 6 reflectors round robin, one every 50 ms
# (--period 300 --interval 50): 20 ICMP echoes/s in all, 3.3/s to each. The run measures the
# rates both send (ICMP echoes seen by the namespace's kernel; bloatlab's UDP probes).
#
# How this differs from cake-autorate in production (OpenWrt, procd service):
# - No CAKE here (no sch_cake in this kernel). cake-autorate still runs the real tc for every
#   rate change (`tc qdisc change root dev X cake bandwidth N`, or `tc -force -batch -` for
#   both); the kernel answers "Qdisc not found" and cake-autorate ignores tc's status (it has
#   no errexit, tc's stderr goes to /dev/null). So each change costs the same fork, exec,
#   parsing and netlink round trip as in production, less only CAKE's own reconfiguration in
#   the kernel. No shim. And `tc qdisc show` finds no "overhead N", so its MTU compensation
#   adds no overhead (as with a CAKE set up without one).
# - The line is idle (nothing crosses the shaped devices): rates sit at BASE, so neither tool
#   changes its shaper after starting (the counts are printed). Under load cake-autorate forks
#   a tc per change (up to 5 a second), bloatlab sends one netlink message: not measured here.
# - enable_sleep_function=0: by default cake-autorate stops fping after 60 s below 2 Mbit/s
#   each way and starts it again on traffic. bloatlab autorate never pauses its probes, so
#   both are measured probing, as on a line in use.
# - Reflectors are 127.0.0.1 ... 127.0.0.30 (as many as defaults.sh lists, so its hourly
#   random replacement restarts fping as in production): ~0.03 ms, never lost, so no
#   reflector is ever judged bad.
# - output_cake_changes=1, to count the changes (a log line for each: nothing on an idle line).
# - The log goes to this run's temporary directory (on OpenWrt /var/log, a tmpfs); not under
#   systemd (INVOCATION_ID unset), so it logs to a file as under procd.
# - This machine's bash, fping and CPU, not a router's: the ratio travels better than the
#   seconds.
# bloatlab autorate drives an HTB class (1:1) on the WAN device and on its IFB (ifb4DEV)
# instead of CAKE: the same netlink path, and equally idle. The bloatlab server's CPU is not
# counted, as the kernel's echo replies to fping are not.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release/bloatlab
secs=${1:-600}
icmp=${2:-}
[ -z "$icmp" ] || [ "$icmp" = --icmp ] || { echo "unknown: $icmp" >&2; exit 2; }
settle=10
[ "$(id -u)" = 0 ] || { echo "needs root (network namespace, cgroup)" >&2; exit 1; }
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
for t in fping git ip tc; do
  command -v "$t" >/dev/null || { echo "needs $t (apt-get install $t)" >&2; exit 1; }
done
src=${CAKE_AUTORATE:-/work/.mirror/lynxthecat+cake-autorate/repo}

ns=bench-arcost-$$
inst=bench$$                       # cake-autorate's instance: config.$inst.sh
tmp=$(mktemp -d /tmp/bench-autorate-cost.XXXXXX)
pids=()
cg=""
cleanup() {
  set +e
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  # cake-autorate's own trap stops fping and its subshells: give it the second or two it takes.
  for _ in $(seq 50); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  # Whatever is left in the namespace or in our cgroups, we started.
  if [ -e "/run/netns/$ns" ]; then
    for p in $(ip netns pids "$ns"); do kill -9 "$p" 2>/dev/null; done
    ip netns del "$ns"
  fi
  if [ -n "$cg" ]; then
    for d in "$cg"/ca "$cg"/bl; do
      [ -d "$d" ] || continue
      while read -r p; do kill -9 "$p" 2>/dev/null; done <"$d/cgroup.procs"
    done
    sleep 0.2
    rmdir "$cg"/ca "$cg"/bl "$cg" 2>/dev/null
  fi
  wait 2>/dev/null
  rm -rf "$tmp" "/run/cake-autorate/$inst"
  rmdir /run/cake-autorate 2>/dev/null
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# cake-autorate's files, from a bare git dir (a mirror) or a checkout.
ca=$tmp/cake-autorate
mkdir -p "$ca" "$tmp/log"
if [ -d "$src/objects" ]; then
  git --git-dir="$src" archive HEAD | tar -x -C "$ca"
  rev=$(git --git-dir="$src" rev-parse --short=12 HEAD)
elif [ -f "$src/cake-autorate.sh" ]; then
  cp "$src"/*.sh "$ca"/
  rev=$(git -C "$src" rev-parse --short=12 HEAD 2>/dev/null || echo "?")
else
  echo "no cake-autorate at $src: set CAKE_AUTORATE to a checkout" >&2
  exit 1
fi
ca_version=$(sed -n 's/^cake_autorate_version="\(.*\)"/\1/p' "$ca/cake-autorate.sh")
n_reflectors=$(bash -c '. "$1"; echo ${#reflectors[@]}' _ "$ca/defaults.sh")

# The namespace: lo for the probes; per tool a WAN (veth) and its download IFB, which carry
# nothing. bloatlab's get HTB with one class, as sqm-scripts' simple.qos makes (with a quantum,
# as it sets one too: spares the kernel's warning at 40 Mbit/s).
ip netns add "$ns"
ip -n "$ns" link set lo up
for who in ca bl; do
  ip -n "$ns" link add "$who-wan" type veth peer name "$who-wan-peer"
  ip -n "$ns" link add "ifb4$who-wan" type ifb
  for d in "$who-wan" "$who-wan-peer" "ifb4$who-wan"; do ip -n "$ns" link set "$d" up; done
done
for d in bl-wan ifb4bl-wan; do
  tc -n "$ns" qdisc add dev "$d" root handle 1: htb default 1
  tc -n "$ns" class add dev "$d" parent 1: classid 1:1 htb quantum 1514 rate 40mbit
done

# Only what running here needs, over defaults.sh (see the header for why each).
{
  echo "dl_if=ifb4ca-wan"
  echo "ul_if=ca-wan"
  printf 'reflectors=('
  for i in $(seq "$n_reflectors"); do printf '"127.0.0.%d" ' "$i"; done
  echo ')'
  echo "log_file_path_override=$tmp/log"
  echo "enable_sleep_function=0"
  echo "output_cake_changes=1"
} >"$ca/config.$inst.sh"

# A cgroup each (cpuacct, or cgroup v2's cpu.stat) counts every process's CPU, reaped or not:
# a check on the /proc sums below, whose children count only once their parent waits for them.
if [ -w /sys/fs/cgroup/cpuacct ]; then
  cg=/sys/fs/cgroup/cpuacct/bench-autorate-cost-$$
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  cg=/sys/fs/cgroup/bench-autorate-cost-$$
fi
[ -z "$cg" ] || mkdir -p "$cg/ca" "$cg/bl" || cg=""
cg_cpu_s() {  # CPU seconds of a cgroup so far
  if [ -f "$1/cpuacct.usage" ]; then awk '{ printf "%.3f", $1 / 1e9 }' "$1/cpuacct.usage"
  else awk '$1 == "usage_usec" { printf "%.3f", $2 / 1e6 }' "$1/cpu.stat"; fi
}
# launch CGROUP CMD...: CMD in the background, inside CGROUP (moved before its exec).
launch() {
  local where=$1
  shift
  (
    if [ -n "$cg" ]; then echo "$BASHPID" >"$cg/$where/cgroup.procs"; fi
    exec "$@"
  ) &
  pids+=($!)
}

# ROOT and its live descendants, one PID a line, by the parent field of /proc/PID/stat.
tree() {
  local -A kids=()
  local f line pid ppid i=0
  for f in /proc/[0-9]*/stat; do
    { read -r line <"$f"; } 2>/dev/null || continue
    pid=${f#/proc/}
    pid=${pid%/stat}
    line=${line##*) }              # past "(comm) ": comm may hold spaces and parentheses
    ppid=${line#* }
    ppid=${ppid%% *}
    kids[$ppid]+=" $pid"
  done
  local todo=("$1")
  while ((i < ${#todo[@]})); do
    pid=${todo[i++]}
    echo "$pid"
    # shellcheck disable=SC2206  # PIDs: split on spaces
    todo+=(${kids[$pid]:-})
  done
}
# CPU seconds of PIDS: utime + stime + cutime + cstime (fields 14-17 of /proc/PID/stat).
cpu_s() {
  local pid line ticks=0
  local -a f
  for pid; do
    { read -r line <"/proc/$pid/stat"; } 2>/dev/null || continue
    read -r -a f <<<"${line##*) }"   # f[0] is field 3
    ticks=$((ticks + f[11] + f[12] + f[13] + f[14]))
  done
  awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f", t / hz }'
}
# kB summed over PIDS of a line of /proc/PID/FILE: VmHWM in status, Pss in smaps_rollup.
mem_kb() {
  local file=$1 key=$2 pid kb=0 v
  shift 2
  for pid; do
    v=$(awk -v k="$key:" '$1 == k { print $2 }' "/proc/$pid/$file" 2>/dev/null) || true
    kb=$((kb + ${v:-0}))
  done
  echo $kb
}
# A counter of the namespace's /proc/net/snmp: snmp Icmp InEchos.
snmp() {
  ip netns exec "$ns" awk -v p="$1:" -v k="$2" \
    '$1 == p { if (!c) { for (i = 2; i <= NF; i++) if ($i == k) c = i } else print $c }' \
    /proc/net/snmp
}

ip netns exec "$ns" "$bin" server --listen 127.0.0.1:9481 -q 2>"$tmp/server.err" &
pids+=($!)
for _ in $(seq 50); do
  ip netns exec "$ns" ss -Hlun 'sport = :9481' | grep -q . && break
  sleep 0.1
done

# As its launcher does: cake-autorate.sh with the config's path; its files beside it.
launch ca ip netns exec "$ns" env -u INVOCATION_ID CAKE_AUTORATE_SCRIPT_PREFIX="$ca" \
  bash "$ca/cake-autorate.sh" "$ca/config.$inst.sh" >"$tmp/ca.out" 2>&1
ca_pid=${pids[-1]}
if [ -n "$icmp" ]; then
  signal=(--reflectors "$(seq -s, -f '127.0.0.%g' 1 30)")
else
  signal=(127.0.0.1:9481)
fi
launch bl "$bin" autorate "${signal[@]}" --netns "$ns" --dev bl-wan \
  --down 5mbit:40mbit:80mbit --up 2mbit:10mbit:20mbit --probe-rate 20 2>"$tmp/bl.err"
bl_pid=${pids[-1]}

sleep "$settle"
for p in $ca_pid $bl_pid; do
  kill -0 "$p" 2>/dev/null || { echo "a contender died:" >&2; cat "$tmp"/*.out "$tmp"/*.err >&2
                                 exit 1; }
done
# fping alone, the probes without the decisions: the floor of any prober at 20 a second here.
fping_of() { for p; do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = fping ] && echo "$p"; done; }
# shellcheck disable=SC2046  # PIDs
fp_pid=$(fping_of $(tree "$ca_pid") | head -1)
fp_cpu0=$(cpu_s $fp_pid)
# shellcheck disable=SC2046  # PIDs
ca_cpu0=$(cpu_s $(tree "$ca_pid"))
# shellcheck disable=SC2046
bl_cpu0=$(cpu_s $(tree "$bl_pid"))
if [ -n "$cg" ]; then cg_ca0=$(cg_cpu_s "$cg/ca"); cg_bl0=$(cg_cpu_s "$cg/bl"); fi
echos0=$(snmp Icmp InEchos)
udp0=$(snmp Udp OutDatagrams)

echo "measuring for $secs s (after $settle s to settle) ..."
sleep "$secs" &
pids+=($!)
wait $!

# Everything read while all still run: fping and the subshells have not been reaped yet.
ca_tree=$(tree "$ca_pid")
bl_tree=$(tree "$bl_pid")
# shellcheck disable=SC2086  # PIDs
{
  ca_cpu1=$(cpu_s $ca_tree)
  fp_cpu1=$(cpu_s $fp_pid)
  fp_hwm=$(mem_kb status VmHWM $fp_pid)
  fp_pss=$(mem_kb smaps_rollup Pss $fp_pid)
  bl_cpu1=$(cpu_s $bl_tree)
  ca_hwm=$(mem_kb status VmHWM $ca_tree)
  bl_hwm=$(mem_kb status VmHWM $bl_tree)
  ca_pss=$(mem_kb smaps_rollup Pss $ca_tree)
  bl_pss=$(mem_kb smaps_rollup Pss $bl_tree)
}
if [ -n "$cg" ]; then cg_ca1=$(cg_cpu_s "$cg/ca"); cg_bl1=$(cg_cpu_s "$cg/bl"); fi
echos1=$(snmp Icmp InEchos)
udp1=$(snmp Udp OutDatagrams)
pinger=""
for p in $ca_tree; do
  if [ "$(cat "/proc/$p/comm" 2>/dev/null)" = fping ]; then
    pinger=$(tr '\0' ' ' <"/proc/$p/cmdline")
  fi
done
ca_procs=$(for p in $ca_tree; do cat "/proc/$p/comm" 2>/dev/null; done | sort | uniq -c |
  awk '{ printf "%s%s x%d", sep, $2, $1; sep = ", " }')

# Stop both the way their service would (SIGTERM), for their own accounts of the run.
kill "$ca_pid" "$bl_pid"
for _ in $(seq 50); do
  kill -0 "$ca_pid" 2>/dev/null || kill -0 "$bl_pid" 2>/dev/null || break
  sleep 0.1
done
ca_changes=$(cat "$tmp"/log/cake-autorate."$inst".log* 2>/dev/null | grep -c '^SHAPER;' || true)
ca_trouble=$(cat "$tmp"/log/cake-autorate."$inst".log* 2>/dev/null |
  grep -c -E 'ERROR|no reflector response|misbehaving|STALL' || true)
bl_changes=$(sed -n 's/.*stopped: \([0-9]*\) rate changes.*/\1/p' "$tmp/bl.err")

echo
echo "cake-autorate $ca_version ($rev), $(fping -v 2>&1 | head -1), bash $BASH_VERSION"
echo "  pinger: ${pinger:-none found}"
echo "  processes: $ca_procs"
awk -v e=$((echos1 - echos0)) -v u=$((udp1 - udp0)) -v s="$secs" 'BEGIN {
  printf "  measured: %.2f ICMP echoes/s (cake-autorate; --icmp: both), %.2f UDP probes/s (bloatlab)\n",
    e / s, u / 2 / s }'
echo "  shaper changes: cake-autorate ${ca_changes} (SHAPER log lines, the start's included)," \
  "bloatlab ${bl_changes:-?} (its summary at SIGTERM)"
echo "  cake-autorate log lines with errors, stalls or bad reflectors: $ca_trouble"
awk -v a="$ca_cpu0" -v b="$bl_cpu0" -v s="$settle" 'BEGIN {
  printf "  start and first %d s: cake-autorate %.2f CPU s, bloatlab %.2f (not counted below)\n",
    s, a, b }'
echo
printf '%-26s %9s %11s %12s %10s %10s\n' "over $secs s" "CPU s" "CPU s/hour" \
  "cgroup CPU s" "peak RSS" "PSS at end"
row() {  # NAME CPU0 CPU1 CG0 CG1 HWM PSS
  awk -v n="$1" -v a="$2" -v b="$3" -v g0="${4:-}" -v g1="${5:-}" -v h="$6" -v p="$7" \
    -v s="$secs" 'BEGIN {
      g = (g0 == "") ? "-" : sprintf("%.2f", g1 - g0)
      printf "%-26s %9.2f %11.1f %12s %7d kB %7d kB\n", n, b - a, (b - a) * 3600 / s, g, h, p }'
}
row "cake-autorate (defaults)" "$ca_cpu0" "$ca_cpu1" "${cg_ca0:-}" "${cg_ca1:-}" \
  "$ca_hwm" "$ca_pss"
row "  of which fping" "$fp_cpu0" "$fp_cpu1" "" "" "$fp_hwm" "$fp_pss"
row "bloatlab autorate (20/s)" "$bl_cpu0" "$bl_cpu1" "${cg_bl0:-}" "${cg_bl1:-}" \
  "$bl_hwm" "$bl_pss"
awk -v a=$ca_cpu0 -v b=$ca_cpu1 -v c=$bl_cpu0 -v d=$bl_cpu1 -v h=$ca_hwm -v k=$bl_hwm 'BEGIN {
  printf "cake-autorate / bloatlab: CPU x%.1f, peak RSS x%.1f\n", (b - a) / (d - c), h / k }'
awk -v a=$fp_cpu0 -v b=$fp_cpu1 -v c=$bl_cpu0 -v d=$bl_cpu1 'BEGIN {
  printf "fping alone / bloatlab: CPU x%.2f (the same probes a second, no decisions)\n",
    (b - a) / (d - c) }'
echo "(CPU: user + system of every process of each, from /proc/PID/stat with waited-for children;"
echo " the cgroup column counts the same from the kernel's side. Peak RSS: the sum of each"
echo " process's VmHWM (shared pages counted in each); PSS shares them out.)"
