#!/usr/bin/env bash
# When writeback starts, against dirty_background_bytes / rate (issue #18: within 20 ms). With
# vm.dirty_background_bytes = 32 MiB and vm.dirty_bytes = 192 MiB, `test writeback` writes
# 256 MiB at each rate; the kernel should start writing once the machine's dirty pages pass
# 33.55 MB, i.e. (33.55 MB - what was already dirty) / rate after the first write. The
# machine's vm.dirty_* values are restored on every exit.
#   usage: scripts/bench-writeback.sh [DIR] [RATES...]   (defaults /var/tmp 200mbit 400mbit 800mbit)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/var/tmp}; shift || true
rates=("${@:-200mbit 400mbit 800mbit}")
. scripts/bench-lib.sh
bench_root vm.dirty_*
bench_needs python3
bench_start
vm=/proc/sys/vm
saved=()
for k in dirty_background_ratio dirty_background_bytes dirty_ratio dirty_bytes; do saved+=("$k=$(cat $vm/$k)"); done
restore() {
  # Writing a _bytes value zeroes its _ratio twin and the other way round: the non-zero last.
  for kv in "${saved[@]}"; do [ "${kv#*=}" = 0 ] || echo "${kv#*=}" > "$vm/${kv%%=*}"; done
  bench_cleanup
}
trap restore EXIT
echo 201326592 > $vm/dirty_bytes
echo 33554432 > $vm/dirty_background_bytes

printf '%-9s %12s %14s %14s %12s %10s\n' rate "dirty before" "expected ms" "started ms" "difference" "disturbed"
for rate in ${rates[*]}; do
  sync
  sleep 1
  $bl test writeback "$dir" --size 256M --rate "$rate" --idle 0.5 --json -q -o "$tmp/wb.json" > "$tmp/s.json"
  python3 - "$rate" "$tmp/s.json" "$tmp/wb.json" <<'PY'
import json, sys
rate, s, f = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
mbps = float(rate.removesuffix("mbit"))
w0 = next(p["start"] for p in f["metadata"]["phases"] if p["name"] == "write")
dirty = next(x for x in f["series"] if x["name"] == "dirty")["samples"]
before = [v for t, v in dirty if t <= w0 and v is not None][-1]
expected = (33.554432 - before) / (mbps / 8) * 1e3
started = s["writeback"]["started_after_ms"]
print(f"{rate:<9} {before:9.1f} MB {expected:14.1f} {started:14.1f} {started - expected:+12.1f} {s['writeback'].get('disturbed') or '-':>10}")
PY
done
