#!/usr/bin/env bash
# RPM agreement on one kernel bottleneck, same run: bloatlab's client against bloatlab's server
# (its own protocol and its HTTPS face) and against nginx as a third-party responsiveness server,
# and Cloudflare's mach and goresponsiveness (third-party clients) against both servers.
#   client - router - server network namespaces, HTB 20 Mbit/s down / 5 Mbit/s up with a pfifo
#   of LIMIT packets on the router's egress, cubic in both end namespaces.
# nginx (Debian's, one worker) serves the config, /small and an 8 GiB sparse /large itself and
# proxies /slurp to bloatlab's plain-HTTP sink, with the same self-signed certificate.
# mach and goresponsiveness measure download, then upload, so bloatlab runs both ways: at once
# (its default, as networkQuality) and --sequential (as they and networkQuality -s do).
# goresponsiveness's row is its single-sided 5% trimmed mean RPM (the draft's), per direction.
# With mach, a last table puts the download RPM of bloatlab's --sequential run and mach's side by
# side per count of load connections (mach ramps at half the draft's pace: compare at equal load).
#
#   scripts/bench-rpm-peers.sh [--out DIR] [--runs N] [--limits "1000 30"] [--mach PATH]
#                              [--goresp PATH]
#
# Needs root, nginx, python3; mach built from cloudflare/networkquality-rs and goresponsiveness
# from network-quality/goresponsiveness (BENCHMARKS.md says how); without them the bloatlab
# rows still run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BLOATLAB:-$PWD/target/release/bloatlab}
out=bench-rpm-peers-out
runs=2
limits="1000 30"
mach=${MACH:-$(command -v mach || true)}
goresp=${GORESP:-$(command -v goresponsiveness || true)}
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --limits) limits=$2; shift 2 ;;
    --mach) mach=$2; shift 2 ;;
    --goresp) goresp=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "bench-rpm-peers: unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "bench-rpm-peers: needs root (network namespaces)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "bench-rpm-peers: build first (cargo build --release)" >&2; exit 1; }
for tool in nginx python3 tc; do
  command -v $tool >/dev/null || { echo "bench-rpm-peers: $tool not found" >&2; exit 1; }
done
[ -n "$mach" ] && [ -x "$mach" ] || { echo "bench-rpm-peers: no mach (--mach PATH): no mach rows" >&2; mach=; }
[ -n "$goresp" ] && [ -x "$goresp" ] || { echo "bench-rpm-peers: no goresponsiveness (--goresp PATH): no goresp rows" >&2; goresp=; }
mkdir -p "$out"
out=$(cd "$out" && pwd -P)
www=$(mktemp -d)
chmod 755 "$www"   # nginx's worker reads the files as its own user

P=brp
CLI=${P}cli RTR=${P}rtr SRV=${P}srv SRV_ADDR=10.99.3.1
allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
. "$(dirname "$0")/topo3-lib.sh"
cleanup() {
  topo3_remove
  sysctl -qw net.ipv4.tcp_allowed_congestion_control="$allowed" || true
  rm -rf "$www"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

topo3_up cubic
in_ns $SRV "$BIN" server -q --https $SRV_ADDR:4043 --http $SRV_ADDR:4080 --self-signed --name $SRV_ADDR \
  --tls-dir "$www/tls" --web-max-gb 10000 >"$out/server.log" 2>&1 &
sleep 1.5
mkdir -p "$www/root/.well-known"
in_ns $CLI curl -s http://$SRV_ADDR:4080/config | sed "s#http://$SRV_ADDR:4080#https://$SRV_ADDR:4443#g" >"$www/root/.well-known/nq"
printf x >"$www/root/small"
truncate -s 8G "$www/root/large"
chmod -R a+rX "$www/root" "$www/tls"
cat >"$www/nginx.conf" <<CONF
worker_processes 1;
pid $www/nginx.pid;
error_log $out/nginx.err;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  server {
    listen $SRV_ADDR:4443 ssl http2;
    ssl_certificate $www/tls/cert.pem;
    ssl_certificate_key $www/tls/key.pem;
    root $www/root;
    add_header Cache-Control no-store;
    client_max_body_size 0;
    location /slurp { proxy_pass http://$SRV_ADDR:4080/slurp; proxy_request_buffering off; proxy_http_version 1.1; }
  }
}
CONF
in_ns $SRV nginx -c "$www/nginx.conf" -g 'daemon off;' &
sleep 1

# One row: client, server, RPM, download RPM, upload RPM, goodput down/up (Mbit/s), and the
# referee: p90 of the delay each router FIFO held while the client ran (ms, its backlog at the
# shaped rate; sampled every 0.1 s).
rows="$out/rows.tsv"
: >"$rows"
row() { # KIND NAME FILE (KIND: bloatlab, mach or goresp)
  python3 - "$1" "$3" "$LIMIT" "$2" >>"$rows" <<'PY'
import json, re, sys
kind, f, limit, name = sys.argv[1:5]
if kind == "goresp":
    # Its text: per direction "Throughput: X Mbps" and "RPM: Y (Single-Sided 5% Trimmed Mean)".
    t = open(f).read()
    # A direction without samples prints NaN or +Inf: "-" in the row.
    def num(pat, text):
        m = re.search(pat, text)
        v = float(m.group(1)) if m else float("nan")
        return v if v == v and v != float("inf") else None
    part = lambda d: t.split(d + ":\n", 1)[1].split("=====", 1)[0] if d + ":\n" in t else ""
    dl, ul = (num(r"RPM:\s+(\S+) \(Single-Sided", part(d)) for d in ("Download", "Upload"))
    gd, gu = (num(r"Throughput:\s+(\S+) Mbps", part(d)) or 0 for d in ("Download", "Upload"))
    rpm = num(r"Final RPM:\s+(\S+) \(Single-Sided", t)
elif kind == "mach":
    v = json.load(open(f))
    d, u = v["download"], v["upload"]
    rpm, dl, ul = min(d["rpm"], u["rpm"]), d["rpm"], u["rpm"]
    gd, gu = d["throughput"] / 1e6, u["throughput"] / 1e6
else:
    v = json.load(open(f))
    rpm, dl, ul = v.get("responsiveness"), v.get("dl_responsiveness"), v.get("ul_responsiveness")
    gd, gu = v["throughput_mbps"].get("down") or 0, v["throughput_mbps"].get("up") or 0
def size(x):  # tc prints a backlog near a multiple of 1024 as "30K" (the sampler cut the "b")
    return float(x[:-1]) * {"K": 1024, "M": 1 << 20}[x[-1]] if x[-1] in "KM" else float(x)
def p90_ms(col, rate):
    q = sorted(size(l.split()[col]) * 8 / rate * 1e3 for l in open(f + ".queues") if len(l.split()) == 3)
    return round(q[int(0.9 * (len(q) - 1))]) if q else "-"
print("\t".join(str(x) if x not in (None, "") else "-" for x in [limit, name, rpm, dl, ul, round(gd, 2), round(gu, 2), p90_ms(1, 20e6), p90_ms(2, 5e6)]))
PY
}
bl() { # NAME TARGET [ARGS...]
  local name=$1 target=$2; shift 2
  local f="$out/$LIMIT.$name.$run.json"
  with_queues "$f.queues" in_ns $CLI "$BIN" test rpm "$target" -k -l 12 --idle 2 --json -q -o "$out/$LIMIT.$name.$run.result.json" "$@" >"$f" 2>"$f.err"
  row bloatlab "$name" "$f" || echo "  $name failed: $(tail -n1 "$f.err")" >&2
}
mach_row() { # NAME CONFIG_URL
  local name=$1 url=$2
  local f="$out/$LIMIT.$name.$run.json"
  # -vv logs each interval (its connections and RPM) to $f.err, for the ramp table below.
  with_queues "$f.queues" in_ns $CLI "$mach" rpm -c "$url" --insecure --disable-aim-scores -vv >"$f" 2>"$f.err"
  row mach "$name" "$f" || echo "  $name failed: $(tail -n1 "$f.err")" >&2
}
goresp_row() { # NAME CONFIG_URL
  local name=$1 url=$2
  local f="$out/$LIMIT.$name.$run.txt"
  with_queues "$f.queues" in_ns $CLI "$goresp" -url "$url" >"$f" 2>"$f.err"
  row goresp "$name" "$f" || echo "  $name failed: $(tail -n1 "$f.err")" >&2
}

BL_URL=https://$SRV_ADDR:4043/.well-known/nq
NGX_URL=https://$SRV_ADDR:4443/.well-known/nq
for LIMIT in $limits; do
  topo3_shape "$LIMIT"
  for run in $(seq 1 "$runs"); do
    echo "limit $LIMIT, run $run" >&2
    bl "bloatlab>bloatlab-protocol" $SRV_ADDR
    bl "bloatlab>bloatlab" "$BL_URL"
    bl "bloatlab>nginx" "$NGX_URL"
    bl "bloatlab>bloatlab-seq" "$BL_URL" --sequential
    bl "bloatlab>nginx-seq" "$NGX_URL" --sequential
    if [ -n "$mach" ]; then
      mach_row "mach>bloatlab" "$BL_URL"
      mach_row "mach>nginx" "$NGX_URL"
    fi
    if [ -n "$goresp" ]; then
      goresp_row "goresp>bloatlab" "$BL_URL"
      goresp_row "goresp>nginx" "$NGX_URL"
    fi
  done
done

echo
printf "%-6s %-28s %6s %6s %6s %9s %8s %9s %9s\n" limit "client>server" RPM dl_RPM ul_RPM "down Mb/s" "up Mb/s" "q_down90" "q_up90"
sort -s -k1,1nr -k2,2 "$rows" | while IFS=$'\t' read -r l n r d u gd gu qd qu; do
  printf "%-6s %-28s %6s %6s %6s %9s %8s %9s %9s\n" "$l" "$n" "$r" "$d" "$u" "$gd" "$gu" "$qd" "$qu"
done
echo "q_down90 / q_up90: p90 of the delay (ms) the router's download / upload FIFO held while the client ran"
if [ -n "$mach" ]; then
  echo
  echo "download RPM by load connections (each over its last 4 intervals): bloatlab's client --sequential"
  echo "(one more connection each interval, as the draft says) and mach (one more every second interval)"
  python3 - "$out" $limits <<'PY'
import glob, json, re, sys
out, limits = sys.argv[1], sys.argv[2:]
for limit in limits:
    for res in sorted(glob.glob(f"{out}/{limit}.bloatlab>bloatlab-seq.*.result.json")):
        run = res.split(".")[-3]
        ours = {}
        for i in json.load(open(res))["metadata"]["rpm_by_direction"]["down"]["intervals"]:
            if i.get("load_connections") and i.get("responsiveness"):
                ours[i["load_connections"]] = i["responsiveness"]
        theirs = {}
        try:
            log = re.sub(r"\x1b\[[0-9;]*m", "", open(f"{out}/{limit}.mach>bloatlab.{run}.json.err").read())
            # The first leg is the download; its intervals come before the second test starts.
            leg = log.split("running responsiveness test: ")[1]
            for loads, rpm in re.findall(r"interval finished interval=\d+ loads=(\d+) .*? rpm=([0-9.]+)", leg):
                if float(rpm) > 0: theirs[int(loads)] = float(rpm)
        except (OSError, IndexError):
            pass
        cells = " ".join(f"{n}:{ours.get(n, float('nan')):.0f}/{theirs.get(n, float('nan')):.0f}" for n in sorted(set(ours) | set(theirs)))
        print(f"  limit {limit}, run {run}, connections:bloatlab/mach  {cells}")
PY
fi
echo "rows: $rows; result files and peers' output: $out"
