#!/usr/bin/env bash
# The lab's packet-rate ceiling (issue #38): bloatlab's own paced UDP load (`test udp`) through
# unshaped lab links, one link and a chain of three, at datagram sizes of 64, 1024 and 1472
# bytes (IP packets of 92, 1052 and 1500 B), each offered at OFFER_KPPS. Prints per case what
# the sender sent and what the server received per second, the TUN devices' drops before the
# model (where a forwarder that falls behind loses packets) and whether the result file got the
# "lab fell behind" event. The server counts its own socket drops apart.
#
#   scripts/bench-lab-pps.sh [-l SECONDS] [--offer KPPS]   (defaults 5 and 300)
#
# Needs root and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BLOATLAB:-$PWD/target/release/bloatlab}
secs=5
offer=300
while [ $# -gt 0 ]; do
  case "$1" in
    -l) secs=$2; shift 2 ;;
    --offer) offer=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "bench-lab-pps: unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "bench-lab-pps: needs root (network namespaces)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "bench-lab-pps: build first (cargo build --release)" >&2; exit 1; }
command -v jq >/dev/null || { echo "bench-lab-pps: jq not found" >&2; exit 1; }
tmp=$(mktemp -d)
cleanup() {
  "$BIN" lab down pps >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

tun_drops() { "$BIN" lab stats --json --lab pps | jq '[.links[] | .up.tun.dropped, .down.tun.dropped] | add'; }
# Packets the last link delivered to the server's host (the lab's own count).
delivered() { "$BIN" lab stats --json --lab pps | jq ".links.l$1.up.tx_packets"; }

printf '%-6s %6s %10s %10s %10s %12s %10s %12s %6s\n' links size "sent kpps" "lab kpps" "recv kpps" "recv Mbit/s" "TUN drops" "socket drops" event
for hops in 1 3; do
  {
    echo 'name="pps"'
    hosts=(c); for i in $(seq 1 $((hops - 1))); do hosts+=("r$i"); done; hosts+=(s)
    for i in $(seq 0 $((hops - 1))); do
      printf '[[link]]\nname="l%s"\na="%s"\nb="%s"\n' "$i" "${hosts[$i]}" "${hosts[$((i + 1))]}"
    done
  } >"$tmp/pps.toml"
  "$BIN" lab up "$tmp/pps.toml" 2>/dev/null
  dst=$("$BIN" lab exec s -- ip -4 -o addr show | awk '$2 != "lo" {sub("/.*", "", $4); print $4; exit}')
  "$BIN" lab exec s -- "$BIN" server -q --max-udp-rate 100000 >"$tmp/server.log" 2>&1 &
  sleep 0.5
  for size in 64 1024 1472; do
    rate=$((offer * size * 8))kbit
    d0=$(tun_drops); o0=$(delivered $((hops - 1)))
    rm -f "$tmp/udp.json"
    if ! "$BIN" lab exec c -- "$BIN" test udp "$dst" --rate "$rate" --size "$size" -l "$secs" \
      --idle 1 --json -q -o "$tmp/udp.json" >/dev/null 2>"$tmp/err"; then
      echo "$hops links, $size B: the test failed: $(head -c 300 "$tmp/err")"
      continue
    fi
    d1=$(tun_drops); o1=$(delivered $((hops - 1)))
    jq -r --arg hops "$hops" --arg size "$size" --arg drops "$((d1 - d0))" --arg secs "$secs" \
      --arg out "$((o1 - o0))" '
      [$hops, $size,
       (.metadata.udp.sent / ($secs | tonumber) / 1000 | . * 10 | round / 10),
       ($out | tonumber / ($secs | tonumber) / 1000 | . * 10 | round / 10),
       ((.metadata.udp.server.received // 0) / ($secs | tonumber) / 1000 | . * 10 | round / 10),
       ((.summary.throughput_mbps.up // 0) | . * 10 | round / 10),
       $drops,
       (.metadata.udp.server.socket_drops // "?"),
       (if any(.events[]; .what | contains("the lab fell behind")) then "yes" else "no" end)]
      | @tsv' "$tmp/udp.json" |
      awk -F'\t' '{ printf "%-6s %6s %10s %10s %10s %12s %10s %12s %6s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
  done
  "$BIN" lab down pps >/dev/null 2>&1
  wait 2>/dev/null || true
done
