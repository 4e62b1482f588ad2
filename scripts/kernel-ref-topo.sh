#!/bin/sh
# The reference line with Linux's own qdiscs, built inside the kernel-ref guest:
#
#   client --- rtr (shapers) --- dly (netem delay box) --- server
#   10.99.2.1  .2.254 | .4.1     .4.2 | .3.254               10.99.3.1
#
# With a modem (--modem-down/--modem-up), a second store-and-forward hop at the line's own rate
# behind the router, as on a home line where the router shapes in front of the modem:
#
#   client --- rtr (shapers) --- mdm (line rate, its buffer) --- dly --- server
#   10.99.2.1  .2.254 | .4.1     .4.2 | .5.1                     .5.2 | .3.254   10.99.3.1
#
# The shapers sit on rtr's egress (towards the client: download; towards dly: upload), the delay
# in its own forwarding namespace, never on an endpoint (where TCP Small Queues would see delayed
# packets as still queued). GRO is off on the NICs and GSO capped everywhere: one skb, one wire packet.
#
#   kernel-ref-topo.sh [options] -- COMMAND...   endpoints are namespaces kr-cli, kr-srv in the
#                                                guest; COMMAND runs after the set-up
#   kernel-ref-topo.sh --nics [options]          endpoints are this machine's namespaces behind
#                                                the guest's eth0 (client) and eth1 (server):
#                                                set up, write $KREF_OUT/ready, wait for
#                                                $KREF_OUT/stop, then write the counters;
#                                                meanwhile $KREF_OUT/reshape ("up SHAPER" or
#                                                "down SHAPER") replaces that shaper in place
#                                                and is renamed to $KREF_OUT/reshaped: one
#                                                boot serves several shapers
# Options:
#   --down SHAPER, --up SHAPER   none | pfifo RATE LIMIT | codel RATE [ARGS] |
#                                fq_codel RATE [ARGS] | cake RATE [ARGS] | netem RATE [ARGS]
#                                (pfifo, codel and fq_codel are leaves of one HTB class at RATE
#                                with sqm's burst and quantum: 1 ms of rate, at least 1749 B)
#   --burst-us N                 HTB burst and quantum in microseconds of rate (default 1000)
#   --overhead N                 HTB shapers: tc stab overhead N (bytes on top of the Ethernet
#                                frame the kernel already counts)
#   --modem-down SHAPER, --modem-up SHAPER   the modem hop's line and buffer, as --down/--up
#                                (e.g. "pfifo 60mbit 1000"); either one adds the hop
#   --modem-overhead N           the modem's HTB: tc stab overhead N (as --overhead)
#   --modem-down-cycle "SECS netem RATE [ARGS]"   (with --nics) a line whose rate steps, as a
#                                Wi-Fi station's does: from when $KREF_OUT/go appears, the
#                                modem's download (a netem --modem-down) alternates SECS s as
#                                --modem-down and SECS s as this netem line; each change's guest
#                                uptime goes to $KREF_OUT/modem-steps.txt
#   --delay-down ARGS, --delay-up ARGS   netem ARGS on the delay box ("delay 7.5ms", "loss 1%")
#   --sample-ms N                (with --nics) every N ms, the router's qdiscs (tc -s -j, one
#                                JSON array per line: rc then rd) to $KREF_OUT/qdisc-samples.jsonl
#                                with the guest's uptime before each pair (one tc process: cheap)
#   --capture                    (with --nics) tcpdump (this machine's) records the headers of what
#                                reaches the router from the line (rd, inbound) with the guest
#                                kernel's arrival times: $KREF_OUT/rtr-rd-in.pcap, and
#                                $KREF_OUT/clocks.txt: uptime and wall clock at one instant
#   --timer-probe                (with --nics) cyclictest (rt-tests on this machine) measures the
#                                guest's timer lateness while it routes: $KREF_OUT/timer-hist.txt
# Counters (tc -s -j qdisc of rtr and dly) go to $KREF_OUT/tc-stats.json at the end.
set -eu

nics=0; down=none; up=none; overhead=; ddown=; dup=; burst_us=1000; sample_ms=; timer_probe=0; capture=0
mdown=none; mup=none; moverhead=; mcycle=
while [ $# -gt 0 ]; do
  case "$1" in
    --nics) nics=1; shift ;;
    --down) down=$2; shift 2 ;;
    --up) up=$2; shift 2 ;;
    --overhead) overhead=$2; shift 2 ;;
    --modem-down) mdown=$2; shift 2 ;;
    --modem-up) mup=$2; shift 2 ;;
    --modem-overhead) moverhead=$2; shift 2 ;;
    --modem-down-cycle) mcycle=$2; shift 2 ;;
    --burst-us) burst_us=$2; shift 2 ;;
    --delay-down) ddown=$2; shift 2 ;;
    --delay-up) dup=$2; shift 2 ;;
    --sample-ms) sample_ms=$2; shift 2 ;;
    --timer-probe) timer_probe=1; shift ;;
    --capture) capture=1; shift ;;
    --) shift; break ;;
    *) echo "kernel-ref-topo: unknown option $1" >&2; exit 2 ;;
  esac
done
out=${KREF_OUT:?run inside scripts/kernel-ref.sh}
job="$*"
modem=0; [ "$mdown" != none ] || [ "$mup" != none ] && modem=1
# The hop behind the router: the modem's namespace, or the delay box itself.
next=kr-dly; [ $modem = 1 ] && next=kr-mdm

in_ns() { ns=$1; shift; ip netns exec "$ns" "$@"; }

# Every command costs ~0.2 s in the emulated guest: batch them.
if [ $modem = 1 ]; then ip netns add kr-mdm; fi
if [ $nics = 1 ]; then
  # GRO would hand the qdiscs merged super-packets: off on the NICs (veths have none).
  ethtool -K eth0 gro off tso off gso off >/dev/null 2>&1 || true
  ethtool -K eth1 gro off tso off gso off >/dev/null 2>&1 || true
  ip -b - <<EOF_
netns add kr-rtr
netns add kr-dly
link set eth0 netns kr-rtr
link set eth1 netns kr-dly
link add rd netns kr-rtr type veth peer name dr netns $next
EOF_
  ip -n kr-rtr link set eth0 name rc
  ip -n kr-dly link set eth1 name ds
else
  ip -b - <<EOF_
netns add kr-cli
netns add kr-rtr
netns add kr-dly
netns add kr-srv
link add rd netns kr-rtr type veth peer name dr netns $next
link add c0 netns kr-cli type veth peer name rc netns kr-rtr
link add s0 netns kr-srv type veth peer name ds netns kr-dly
EOF_
  endpoint() { # namespace device address gateway
    ip -n "$1" -b - <<EOF_
link set lo up
addr add $3/24 dev $2
link set dev $2 gso_max_size 1514 gso_max_segs 1 up
route add default via $4
EOF_
  }
  endpoint kr-cli c0 10.99.2.1 10.99.2.254
  endpoint kr-srv s0 10.99.3.1 10.99.3.254
fi
forwarder() { # namespace dev-a addr-a dev-b addr-b "NET via GW"...: addresses, GSO cap, routes
  ns=$1; a=$2; aa=$3; b=$4; ba=$5; shift 5
  { echo "link set lo up"; echo "addr add $aa/24 dev $a"; echo "addr add $ba/24 dev $b"
    for d in "$a" "$b"; do echo "link set dev $d gso_max_size 1514 gso_max_segs 1 up"; done
    for r in "$@"; do echo "route add $r"; done
  } | ip -n "$ns" -b -
}
forwarder kr-rtr rc 10.99.2.254 rd 10.99.4.1 "10.99.3.0/24 via 10.99.4.2"
if [ $modem = 1 ]; then
  # The modem: dr faces the router (its egress: the download), md the delay box (the upload).
  ip link add md netns kr-mdm type veth peer name dr netns kr-dly
  forwarder kr-mdm dr 10.99.4.2 md 10.99.5.1 "10.99.3.0/24 via 10.99.5.2" "10.99.2.0/24 via 10.99.4.1"
  forwarder kr-dly dr 10.99.5.2 ds 10.99.3.254 "10.99.2.0/24 via 10.99.5.1"
else
  forwarder kr-dly dr 10.99.4.2 ds 10.99.3.254 "10.99.2.0/24 via 10.99.4.1"
fi
# Forwarding on in every router (sysctl -w in one namespace each).
for n in rtr dly $([ $modem = 1 ] && echo mdm); do in_ns kr-$n sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'; done

# sqm's HTB burst and quantum: 1000 us of rate in bytes (--burst-us), at least one ATM-expanded 1500 B packet.
htb_bytes() {
  kbit=$(tc_kbit "$1")
  b=$((kbit * burst_us / 8000))
  [ $b -lt 1749 ] && b=1749
  echo $b
}
tc_kbit() { # 57mbit, 3800kbit, 1gbit -> kbit
  case "$1" in
    *gbit) echo $(( ${1%gbit} * 1000000 )) ;;
    *mbit) awk -v v="${1%mbit}" 'BEGIN{printf "%d", v * 1000}' ;;
    *kbit) echo "${1%kbit}" ;;
    *) echo "kernel-ref-topo: rate $1: want kbit, mbit or gbit" >&2; exit 2 ;;
  esac
}

shape() { # namespace dev spec overhead
  ns=$1; dev=$2; ov=$4; set -- $3
  kind=$1; [ "$kind" = none ] && return 0
  rate=$2; shift 2
  case "$kind" in
    cake) in_ns "$ns" tc qdisc add dev "$dev" root cake bandwidth "$rate" "$@"; return ;;
    netem) in_ns "$ns" tc qdisc add dev "$dev" root netem rate "$rate" "$@"; return ;;
  esac
  bytes=$(htb_bytes "$rate")
  stab=; [ -n "$ov" ] && stab="stab overhead $ov linklayer ethernet"
  in_ns "$ns" tc qdisc add dev "$dev" root handle 1: $stab htb default 1
  in_ns "$ns" tc class add dev "$dev" parent 1: classid 1:1 htb rate "$rate" ceil "$rate" burst $bytes cburst $bytes quantum $bytes
  case "$kind" in
    pfifo) in_ns "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: pfifo limit "$1" ;;
    codel|fq_codel) in_ns "$ns" tc qdisc add dev "$dev" parent 1:1 handle 10: "$kind" "$@" ;;
    *) echo "kernel-ref-topo: shaper $kind: want none, pfifo, codel, fq_codel, cake or netem" >&2; exit 2 ;;
  esac
}
shape kr-rtr rc "$down" "$overhead"
shape kr-rtr rd "$up" "$overhead"
shape kr-mdm dr "$mdown" "$moverhead"
shape kr-mdm md "$mup" "$moverhead"
# The delay box: netem with room for any bandwidth-delay product, so it never drops by itself.
[ -n "$ddown" ] && in_ns kr-dly tc qdisc add dev dr root netem limit 100000 $ddown
[ -n "$dup" ] && in_ns kr-dly tc qdisc add dev ds root netem limit 100000 $dup

counters() {
  { echo '{"rtr":'; in_ns kr-rtr tc -s -j qdisc show; echo ',"dly":'; in_ns kr-dly tc -s -j qdisc show
    [ $modem = 1 ] && { echo ',"mdm":'; in_ns kr-mdm tc -s -j qdisc show; }
    echo '}'; } > "$out/tc-stats.json"
}

# Centiseconds of guest uptime into $cs (/proc/uptime has two decimals): a builtin read and
# shell arithmetic, no fork (each process costs ~0.2 s of the guest's CPU here).
uptime_cs() { read -r u _ < /proc/uptime; cs=${u%.*}${u#*.}; }
cycle_modem() { # alternate the modem's download between $mdown and the cycle's line
  secs=${mcycle%% *}; alt=${mcycle#* }
  while [ ! -e "$out/go" ]; do [ -e "$out/stop" ] && return 0; sleep 0.05; done
  uptime_cs; t0=$cs; step=0
  echo "$t0 go" >> "$out/modem-steps.txt"
  while [ ! -e "$out/stop" ]; do
    # Sleep to the next step in one process where it is near, else for 1 s and look for stop:
    # polling every 50 ms kept the guest's CPU forking and delayed the packets it routes.
    uptime_cs; left=$(( t0 + (step + 1) * secs * 100 - cs ))
    if [ $left -gt 100 ]; then sleep 1; continue; fi
    [ $left -gt 0 ] && sleep "$((left / 100)).$((left / 10 % 10))$((left % 10))"
    step=$((step + 1)); spec=$mdown; [ $((step % 2)) = 1 ] && spec=$alt
    set -- $spec; rate=$2; shift 2
    in_ns kr-mdm tc qdisc change dev dr root netem rate "$rate" "$@"
    uptime_cs; echo "$cs $rate" >> "$out/modem-steps.txt"
  done
}

if [ $nics = 1 ]; then
  [ -n "$mcycle" ] && cycle_modem &
  if [ -n "$sample_ms" ]; then
    # One tc process reads commands from a pipe: spawning tc per sample costs ~0.2 s here.
    # Each pair of lines has its stamp (guest uptime) on the same line of qdisc-stamps.txt.
    sleep_s=$(awk -v m="$sample_ms" 'BEGIN{printf "%.3f", m / 1000}')
    ( while [ ! -e "$out/stop" ]; do
        read -r up _ < /proc/uptime; echo "$up" >> "$out/qdisc-stamps.txt"
        echo "qdisc show dev rc"; echo "qdisc show dev rd"; sleep "$sleep_s"
      done ) | in_ns kr-rtr tc -s -j -batch - > "$out/qdisc-samples.jsonl" 2>/dev/null &
  fi
  if [ $capture = 1 ]; then
    # Started directly (not through the in_ns function, whose subshell would ignore the
    # signal as any background job of a script does): $cap is tcpdump itself.
    ip netns exec kr-rtr tcpdump -q -n -i rd -Q in -s 96 -B 16384 -w "$out/rtr-rd-in.pcap" 2>/dev/null &
    cap=$!
    # The capture's stamps are wall-clock time, the samples' and steps' the uptime: both clocks
    # read within microseconds of each other (this machine's python3), once.
    python3 -c 'import time; print(time.clock_gettime(time.CLOCK_BOOTTIME), time.time())' > "$out/clocks.txt"
  fi
  if [ $timer_probe = 1 ]; then
    # A 1 ms periodic timer, like a shaper's watchdog: how late does the guest wake it?
    cyclictest -m -t1 -p 80 -i 1000 -h 50000 -q --histfile="$out/timer-hist.txt" > "$out/timer-summary.txt" 2>&1 &
    ct=$!
  fi
  touch "$out/ready"
  # 1 s polls: the host waits for the counters anyway, and every sleep is a process here.
  while [ ! -e "$out/stop" ]; do
    if [ -e "$out/reshape" ]; then
      read -r dir spec < "$out/reshape"
      case "$dir" in
        up) dev=rd ;;
        down) dev=rc ;;
        *) echo "kernel-ref-topo: reshape $dir: want up or down" >&2; exit 2 ;;
      esac
      in_ns kr-rtr tc qdisc del dev "$dev" root 2>/dev/null || true
      shape kr-rtr "$dev" "$spec" "$overhead"
      mv "$out/reshape" "$out/reshaped"
      continue
    fi
    sleep 1
  done
  [ $timer_probe = 1 ] && kill -INT $ct
  [ $capture = 1 ] && kill -TERM $cap
  wait
  counters
else
  rc=0
  sh -c "$job" || rc=$?
  counters
  exit $rc
fi
