# Sourced by the peer benches: client - router - server network namespaces ($CLI $RTR $SRV,
# set by the caller, server at $SRV_ADDR = 10.99.3.1, client 10.99.2.1), HTB + pfifo on the
# router's egress, one congestion control in both end namespaces. Needs in_ns and $allowed
# (the host's tcp_allowed_congestion_control, restored by the caller's cleanup).
in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# What a bench needs before it builds anything: root, the release build ($BIN), jq.
topo3_require() { # NAME
  [ "$(id -u)" = 0 ] || { echo "$1: needs root (network namespaces)" >&2; exit 1; }
  [ -x "$BIN" ] || { echo "$1: build first (cargo build --release)" >&2; exit 1; }
  command -v jq >/dev/null || { echo "$1: jq not found" >&2; exit 1; }
}

# End whatever runs in the namespaces, then delete them.
topo3_remove() {
  for n in $CLI $RTR $SRV; do
    pids=$(ip netns pids $n 2>/dev/null || true)
    [ -n "$pids" ] && kill $pids 2>/dev/null || true
  done
  sleep 0.3
  for n in $CLI $RTR $SRV; do ip netns del $n 2>/dev/null || true; done
}

topo3_up() { # CC
  local cc=$1
  topo3_remove
  # A namespace may only default to an algorithm the host allows unprivileged sockets to use.
  sysctl -qw net.ipv4.tcp_allowed_congestion_control="$allowed $cc"
  for n in $CLI $RTR $SRV; do ip netns add $n; ip -n $n link set lo up; done
  ip link add c0 netns $CLI type veth peer name rc netns $RTR
  ip link add s0 netns $SRV type veth peer name rs netns $RTR
  ip -n $CLI addr add 10.99.2.1/24 dev c0; ip -n $RTR addr add 10.99.2.254/24 dev rc
  ip -n $SRV addr add $SRV_ADDR/24 dev s0; ip -n $RTR addr add 10.99.3.254/24 dev rs
  for p in "$CLI c0" "$RTR rc" "$RTR rs" "$SRV s0"; do
    set -- $p
    # TCP's 64 KB software-GSO packets would count as one packet in a pfifo.
    ip -n $1 link set $2 gso_max_size 1514 gso_max_segs 1 up
    in_ns $1 ethtool -K $2 tso off gso off gro off >/dev/null 2>&1 || true
  done
  ip -n $CLI route add default via 10.99.2.254
  ip -n $SRV route add default via 10.99.3.254
  in_ns $RTR sysctl -qw net.ipv4.ip_forward=1
  # Every tool's flows get the same congestion control, also those that cannot set it.
  for n in $CLI $SRV; do in_ns $n sysctl -qw net.ipv4.tcp_congestion_control=$cc; done
}

# HTB 20 Mbit/s towards the client, 5 Mbit/s towards the server, each over a pfifo of LIMIT.
topo3_shape() { # LIMIT
  local limit=$1
  for spec in "rc 20mbit" "rs 5mbit"; do
    set -- $spec
    in_ns $RTR tc qdisc del dev $1 root 2>/dev/null || true
    in_ns $RTR tc qdisc add dev $1 root handle 1: htb default 1
    in_ns $RTR tc class add dev $1 parent 1: classid 1:1 htb rate $2
    in_ns $RTR tc qdisc add dev $1 parent 1:1 handle 10: pfifo limit "$limit"
  done
}

# The referee: the router's own queues, sampled every 100 ms while a tool runs (bytes in each
# pfifo), written as "t rc_bytes rs_bytes" lines to FILE.
sample_queues() { # FILE
  exec ip netns exec $RTR sh -c 'q() { tc -s qdisc show dev $1 | awk "/pfifo/{f=1} f&&/backlog/{sub(/b\$/,\"\",\$2); print \$2; exit}"; }
    while :; do echo "$(date +%s.%N) $(q rc) $(q rs)"; sleep 0.1; done' > "$1"
}
with_queues() { # FILE command...
  local f=$1; shift
  sample_queues "$f" &
  local sq=$!
  "$@" || true
  kill $sq 2>/dev/null; wait $sq 2>/dev/null || true
}
