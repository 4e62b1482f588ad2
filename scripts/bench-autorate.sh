#!/usr/bin/env bash
# autorate on lines that move, side by side in one run per preset: `lab compare` with the same
# rrul-be through fixed CAKE at BASE (95% of the line's mean), fixed CAKE at MAX (95% of its
# busiest second), CAKE moved by cake-autorate's law (our re-implementation), by ours, and by the
# oracle (95% of what the line will carry over the next 100 ms, from its own schedule), and
# where a checkout of it is at hand, by cake-autorate itself (`--fix cake-autorate-sh`: its
# bash script and fping at its defaults on the lab's router). Each
# run meets the preset's schedule or trace from its start. Prints per preset and fix the
# best-effort probes' added latency p95 and the share of the line's capacity over the load
# phase delivered each way (goodput over capacity) and what the line carried each way (its wire
# bytes over capacity: goodput, headers, the other way's ACKs, probes). Needs root and a release
# build.
#
#   scripts/bench-autorate.sh [SECONDS] [PRESET...]   # load phase, default 120; default presets
#                                                    # lte starlink cable-evening
#   CAKE_AUTORATE=DIR scripts/bench-autorate.sh ...    # a cake-autorate checkout or bare git dir
#                                                    # (default: the local mirror below)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/bloatlab
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
secs=${1:-120}
shift || true
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(lte starlink cable-evening)
work=$(mktemp -d /tmp/bench-autorate.XXXXXX)
trap 'rm -rf "$work"' EXIT
fixes=cake,cake-max,cake-autorate,autorate,cake-oracle
peer=()
src=${CAKE_AUTORATE:-/work/.mirror/lynxthecat+cake-autorate/repo}
if [ -d "$src/objects" ]; then
  mkdir "$work/cake-autorate"
  git --git-dir="$src" archive HEAD | tar -x -C "$work/cake-autorate"
  src=$work/cake-autorate
fi
if [ -f "$src/cake-autorate.sh" ]; then
  command -v fping >/dev/null || { echo "cake-autorate needs fping (apt-get install fping)" >&2; exit 1; }
  fixes+=,cake-autorate-sh
  peer=(--cake-autorate "$src")
else
  echo "no cake-autorate at $src (set CAKE_AUTORATE): without cake-autorate itself" >&2
fi

printf '%-14s %-30s %12s %8s %8s %10s %10s %8s\n' preset fix "added p95 ms" "down %" "up %" \
  "line down" "line up" changes
for p in "${presets[@]}"; do
  "$bin" lab compare "$p" --fix "$fixes" "${peer[@]}" \
    --test rrul-be -l "$secs" \
    --json -q --out-dir "$work" >"$work/$p.json" 2>"$work/$p.log" ||
    { cat "$work/$p.log"; exit 1; }
  python3 - "$p" "$work/$p.json" <<'PY'
import json, sys
preset, path = sys.argv[1], sys.argv[2]
for r in json.load(open(path))["runs"]:
    cap, t, line = r["capacity_bps"], r["summary"]["throughput_mbps"], r["line_carried"]
    share = lambda m, c: "-" if m is None or not c else f"{m * 1e6 / c * 100:.0f}"
    p95 = r["added_p95_ms"]
    print(f'{preset:<14} {r["fix"]:<30} {"-" if p95 is None else f"{p95:.1f}":>12} '
          f'{share(t.get("down"), cap["down"]):>8} {share(t.get("up"), cap["up"]):>8} '
          f'{share(line["down"], 1e6):>10} {share(line["up"], 1e6):>10} '
          f'{r["rate_changes"] if r["rate_changes"] is not None else "-":>8}')
PY
done
