#!/usr/bin/env bash
# The HTTP face against nginx on loopback, same run: HTTP/2 over TLS, curl as the client, the
# responsiveness endpoints on both. nginx (one worker) serves the config, /small and /large
# (an 8 GiB sparse file) itself and proxies /slurp to bloatlab's plain-HTTP sink (nginx cannot
# discard an upload itself without resetting HTTP/2 streams). Prints Gbit/s and Gbit/s per core
# of server CPU for a download of /large and an upload to /slurp. With MACH=PATH (Cloudflare's
# mach, built from cloudflare/networkquality-rs), mach is a second client: `mach download` of
# the whole 8 GiB /large and `mach upload` of 4 GB, both HTTP/2 over TLS; Gbit/s per core of
# server CPU is bytes x 8 over the server's CPU seconds, so a slower client changes the
# Gbit/s, not the per-core figure it is compared by.
#   usage: [MACH=PATH] scripts/bench-web.sh [SECONDS] [RUNS]   (defaults 5 3)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}; runs=${2:-3}
for tool in nginx curl python3; do
  command -v $tool >/dev/null || { echo "bench-web: needs $tool (apt-get install nginx-light curl)" >&2; exit 1; }
done
cargo build --release --quiet
bl=$PWD/target/release/bloatlab
tmp=$(mktemp -d)
chmod 755 "$tmp"   # nginx's worker reads the files as its own user
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
hz=$(getconf CLK_TCK)
ticks() { local t=0; for p in "$@"; do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }

$bl server --listen 127.0.0.1:0 --https 127.0.0.1:14043 --http 127.0.0.1:14080 --self-signed --tls-dir "$tmp/tls" --web-max-gb 100000 -q 2>"$tmp/bl.log" &
bl_pid=$!; pids+=($bl_pid)
sleep 1
mkdir -p "$tmp/www/.well-known"
curl -s http://127.0.0.1:14080/config | sed 's/127.0.0.1:14080/127.0.0.1:14443/g; s/http:/https:/g' >"$tmp/www/.well-known/nq"
printf x >"$tmp/www/small"
truncate -s 8G "$tmp/www/large"
cat >"$tmp/nginx.conf" <<CONF
worker_processes 1;
pid $tmp/nginx.pid;
error_log $tmp/nginx.err;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  server {
    listen 127.0.0.1:14443 ssl http2;
    ssl_certificate $tmp/tls/cert.pem;
    ssl_certificate_key $tmp/tls/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
    root $tmp/www;
    add_header Cache-Control no-store;
    client_max_body_size 0;
    location /slurp { proxy_pass http://127.0.0.1:14080/slurp; proxy_request_buffering off; proxy_http_version 1.1; }
  }
}
CONF
nginx -c "$tmp/nginx.conf" -g 'daemon off;' &
nginx_master=$!; pids+=($nginx_master)
sleep 1
nginx_pids="$nginx_master $(pgrep -P $nginx_master | tr '\n' ' ')"
truncate -s 8G "$tmp/up.bin"

mach=${MACH:-}
if [ -n "$mach" ] && [ ! -x "$mach" ]; then echo "bench-web: MACH=$mach is not an executable" >&2; exit 1; fi
measure() { # label URL up|down|mach-up|mach-down PIDS...
  local label=$1 url=$2 dir=$3; shift 3
  local c0 c1 t0 t1 bytes
  c0=$(ticks "$@"); t0=$(date +%s.%N)
  if [ "$dir" = mach-down ] || [ "$dir" = mach-up ]; then
    if [ "$dir" = mach-down ]; then
      "$mach" download "$url" h2 --insecure > "$tmp/mach.json" 2>/dev/null || true
    else
      "$mach" upload "$url" h2 -b 4000000000 --insecure > "$tmp/mach.json" 2>/dev/null || true
    fi
    bytes=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1])).get('bytes_total', 0))" "$tmp/mach.json" 2>/dev/null || echo 0)
  elif [ "$dir" = down ]; then
    bytes=$(curl -sk --http2 --max-time "$secs" -o /dev/null -w '%{size_download}' "$url" || true)
  else
    # -T streams the file (a PUT; /slurp takes PUT and POST alike).
    bytes=$(curl -sk --http2 --max-time "$secs" -T "$tmp/up.bin" -o /dev/null -w '%{size_upload}' "$url" || true)
  fi
  c1=$(ticks "$@"); t1=$(date +%s.%N)
  python3 -c "import sys; l, b, c, hz, s = sys.argv[1], float(sys.argv[2] or 0), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]); g = b * 8 / s / 1e9; cpu = c / hz / s; print(f'{l:<28} {g:8.2f} {cpu*100:8.0f} {g/max(cpu, 1e-9):16.2f}')" "$label" "$bytes" "$((c1 - c0))" "$hz" "$(echo "$t1 - $t0" | bc -l)"
}
printf '%-28s %8s %8s %16s\n' "server, HTTP/2 over TLS" Gbit/s "CPU %" "Gbit/s per core"
for r in $(seq "$runs"); do
  measure "bloatlab /large" https://127.0.0.1:14043/large down $bl_pid
  # shellcheck disable=SC2086
  measure "nginx /large" https://127.0.0.1:14443/large down $nginx_pids
  measure "bloatlab /slurp" https://127.0.0.1:14043/slurp up $bl_pid
  # nginx's upload costs its worker and the sink it proxies to.
  # shellcheck disable=SC2086
  measure "nginx /slurp (+ sink)" https://127.0.0.1:14443/slurp up $nginx_pids $bl_pid
  if [ -n "$mach" ]; then
    measure "mach: bloatlab /large" https://127.0.0.1:14043/large mach-down $bl_pid
    # shellcheck disable=SC2086
    measure "mach: nginx /large" https://127.0.0.1:14443/large mach-down $nginx_pids
    measure "mach: bloatlab /slurp" https://127.0.0.1:14043/slurp mach-up $bl_pid
    # shellcheck disable=SC2086
    measure "mach: nginx /slurp (+ sink)" https://127.0.0.1:14443/slurp mach-up $nginx_pids $bl_pid
  fi
done
