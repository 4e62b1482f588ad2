#!/usr/bin/env bash
# The lab against Linux: the same line built once in bloatlab's lab and once with Linux's own
# qdiscs in Debian's kernel as the router (scripts/kernel-ref.sh --tap), the same bloatlab
# endpoints (this machine's TCP, congestion control pinned) running the same tests through
# each. Prints per scenario and test: goodput each way, added latency p50/p90 per probe class
# (BE, EF, CS1), drops, and the lab-to-kernel ratio of each.
#
#   scripts/bench-kernel-ref.sh [--out DIR] [--length S] [--repeat N] [--cc ALGO]
#                               [--tests "tcp-down tcp-up rrul voip"] [--test-args "ARGS"]
#                               [--report-only] [SCENARIO...]
#
# --test-args adds options to every test on both sides (e.g. "--step 0.02": probes at half rate).
#
# Scenarios (name: line; the lab adds 14 B per packet as the kernel counts Ethernet headers;
# cake shapes by itself at the rate, tc's defaults: diffserv3, triple-isolate, raw; cake+OPT
# adds tc's option OPT, e.g. cake+besteffort; sqm-docsis: sqm counting 18 B per IP packet).
# A sixth column DOWN/UP puts a modem behind the shaper, as `lab compare cable` does: the
# router shapes on the client's link, and a second hop carries the line's own rate with a
# 1000-packet FIFO, 18 B per IP packet and the delay (the kernel's modem is HTB + pfifo in its
# own namespace); CAKE there runs in ingress mode downstream, as compare sets it. DOWN/UP
# "wifi" is the lab's preset `wifi` instead: the download in 4 ms aggregates at 40 Mbit/s that
# drops to 10 Mbit/s for 10 s of every 20 (the lab's trace; the kernel's netem slot line,
# stepped by the guest from the test's start), 8 Mbit/s up, 1000 packets each way. Those
# scenarios also get a table per phase of the step (read from the download goodput).
#
# KREF_TOPO_ARGS replaces the guest topology's options (default "--burst-us 5000"): with
# "--sample-ms 250 --capture" a wifi-autorate run keeps the router's qdisc samples and its
# arrivals, and the report adds Linux's capacity estimate per step beside the lab's CAKE model
# fed those very arrivals (crates/lab-model/examples/autorate_replay.rs; built here if missing).
SCENARIOS="
unshaped      1gbit   1gbit     0    none
delay-only    1gbit   1gbit     2    none
fifo-sym      20mbit  20mbit    0    fifo
fifo-asym     30mbit  2mbit     0    fifo
fifo-asym-d   30mbit  2mbit     7.5  fifo
codel-asym-d  30mbit  2mbit     7.5  codel
codel-slow-d  15mbit  1mbit     7.5  codel
codel-5-d     5mbit   1mbit     7.5  codel
fqc-short     20mbit  20mbit    2    fq_codel
fqc-sym-d     20mbit  20mbit    7.5  fq_codel
fqc-asym      57mbit  3800kbit  0    fq_codel
fqc-asym-d    57mbit  3800kbit  7.5  fq_codel
fqc-slow      15mbit  1mbit     0    fq_codel
fqc-slow-d    15mbit  1mbit     7.5  fq_codel
sqm-asym-d    57mbit  3800kbit  7.5  sqm
netem-jitter  20mbit  20mbit    10   jitter
netem-loss    20mbit  20mbit    10   loss
netem-ge      20mbit  20mbit    10   ge
cake-sym-d    20mbit  20mbit    7.5  cake
cake-asym-d   57mbit  3800kbit  7.5  cake
cake-be-d     57mbit  3800kbit  7.5  cake+besteffort
cake-ack-d    57mbit  3800kbit  7.5  cake+ack-filter
cake-docsis-d 57mbit  3800kbit  7.5  cake+docsis
cable-fifo    -       -         7.5  none         60mbit/4mbit
cable-sqm     57mbit  3800kbit  7.5  sqm-docsis   60mbit/4mbit
cable-cake    57mbit  3800kbit  7.5  cake+docsis  60mbit/4mbit
wifi-fixed    38mbit  1gbit     10   cake+besteffort                   wifi
wifi-autorate 38mbit  1gbit     10   cake+besteffort+autorate-ingress  wifi
"
# Tests per scenario: tcp-down, tcp-up, rrul (voip with --voip).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BLOATLAB:-target/release/bloatlab}
out=bench-kernel-ref-out
length=20
repeat=1
cc=cubic
tests="tcp-down tcp-up rrul"
test_args=()
pick=()
report_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --length) length=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --cc) cc=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --test-args) read -r -a test_args <<< "$2"; shift 2 ;;
    --report-only) report_only=1; shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) pick+=("$1"); shift ;;
  esac
done
[ -x "$BIN" ] || { echo "bench-kernel-ref: build first (cargo build --release)" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd -P)
# Whatever stops the bench, leave no namespace, lab or guest behind.
cleanup() {
  # Nothing left to remove is fine: without this, errexit made a complete run exit 1 here.
  set +e
  ip netns del kb-cli 2>/dev/null; ip netns del kb-srv 2>/dev/null
  "$BIN" lab down kbench >/dev/null 2>&1
  rm -rf /tmp/bloatlab-kref-bench.*
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Per scenario: the lab's link settings and the kernel's shaper / delay-box arguments.
lab_qdisc() { # kind -> lab key=value settings per direction (same for both)
  case "$1" in
    fifo) echo 'qdisc = "fifo", limit = 100' ;;
    none) echo 'qdisc = "fifo", limit = 1000' ;;
    codel) echo 'qdisc = "codel", limit = 1000' ;;
    fq_codel) echo 'qdisc = "fq_codel"' ;;
    sqm|sqm-docsis) echo 'qdisc = "fq_codel", limit = 1001, quantum = 300' ;;
    jitter) echo 'qdisc = "fifo", limit = 1000, jitter = "2ms", reorder = true' ;;
    loss) echo 'qdisc = "fifo", limit = 1000, loss = "1%"' ;;
    ge) echo 'qdisc = "fifo", limit = 1000, ge = "1%,30%,50%,0%"' ;;
    cake*) echo 'limit = 1000' ;;  # the qdisc, with its rate, goes per direction (lab_run)
  esac
}
kernel_shaper() { # kind rate
  case "$1" in
    fifo) echo "pfifo $2 100" ;;
    none) echo "none" ;;
    codel) echo "codel $2 limit 1000 noecn" ;;
    fq_codel) echo "fq_codel $2" ;;
    sqm|sqm-docsis) echo "fq_codel $2 limit 1001 quantum 300" ;;
    jitter|loss|ge) echo "pfifo $2 1000" ;;
    cake*) echo "cake $2 $(cake_opts "$1")" ;;
  esac
}
kernel_netem() { # kind one-way-delay-ms
  local d=$2 extra=
  case "$1" in
    jitter) extra="2ms" ;;  # netem's jitter: uniform +/- (no distribution table)
    loss) extra="loss 1%" ;;
    ge) extra="loss gemodel 1% 30% 50% 0%" ;;
  esac
  [ "$d" = 0 ] && [ -z "$extra" ] && return 0
  echo "delay ${d}ms $extra"
}

run_test() { # prefix-ns host test file
  local ns=$1 host=$2 t=$3 file=$4
  local args=(-l "$length" --idle 5 --cc "$cc" -q --json -o "$file.json.gz")
  [ "$t" = tcp-down ] || [ "$t" = tcp-up ] && args+=(--flows 4)
  [ "$t" = voip ] && args=(--under-load -l "$length" --idle 5 --cc "$cc" -q --json -o "$file.json.gz")
  args+=("${test_args[@]}")
  ip netns exec "$ns" ${ENDPOINT_PIN:-} "$BIN" test "$t" "$host" "${args[@]}" > "$file.summary.json" 2> "$file.err" || {
    echo "  $t failed: $(tail -n1 "$file.err")" >&2; return 1; }
}

lab_overhead() { # kind -> bytes the lab counts on top of the IP packet
  case "$1" in *docsis) echo 18 ;; *) echo 14 ;; esac
}

kernel_run() { # scen down up delay kind modem test file
  local down=$2 up=$3 delay=$4 kind=$5 modem=$6 t=$7 file=$8
  local dir; dir=$(mktemp -d /tmp/bloatlab-kref-bench.XXXXXX)
  local cli=kb-cli srv=kb-srv
  ip netns del $cli 2>/dev/null || true; ip netns del $srv 2>/dev/null || true
  ip netns add $cli; ip netns add $srv
  local sdown; sdown=$(kernel_shaper "$kind" "$down")
  # compare's CAKE behind a modem runs in ingress mode downstream.
  [ -n "$modem" ] && [ "${kind%%+*}" = cake ] && sdown+=" ingress"
  local args=(${KREF_TOPO_ARGS:---burst-us 5000} --down "$sdown" --up "$(kernel_shaper "$kind" "$up")")
  # HTB counts the Ethernet header (14 B): stab adds the rest of 18.
  [ "$kind" = sqm-docsis ] && args+=(--overhead 4)
  if [ "$modem" = wifi ]; then
    args+=(--modem-down "netem 40mbit slot 4ms 4ms limit 1000" --modem-up "pfifo 8mbit 1000"
      --modem-down-cycle "10 netem 10mbit slot 4ms 4ms limit 1000")
  elif [ -n "$modem" ]; then
    args+=(--modem-down "pfifo ${modem%/*} 1000" --modem-up "pfifo ${modem#*/} 1000" --modem-overhead 4)
  fi
  local nm; nm=$(kernel_netem "$kind" "$delay")
  [ -n "$nm" ] && args+=(--delay-down "$nm" --delay-up "$nm")
  scripts/kernel-ref.sh --out "$dir" --timeout $((length * 3 + 120)) --tap kbc@$cli --tap kbs@$srv -- \
    "scripts/kernel-ref-topo.sh --nics $(printf '%q ' "${args[@]}")" > "$file.guest.log" 2>&1 &
  local g=$!
  for _ in $(seq 300); do [ -e "$dir/ready" ] && break; kill -0 $g 2>/dev/null || break; sleep 0.2; done
  if [ ! -e "$dir/ready" ]; then echo "  kernel guest did not come up: $(tail -n1 "$file.guest.log")" >&2; wait $g; ip netns del $cli; ip netns del $srv; rm -rf "$dir"; return 1; fi
  ip -n $cli addr add 10.99.2.1/24 dev kbc; ip -n $cli route add default via 10.99.2.254
  ip -n $srv addr add 10.99.3.1/24 dev kbs; ip -n $srv route add default via 10.99.3.254
  ip netns exec $srv ${ENDPOINT_PIN:-} "$BIN" server -q > /dev/null 2>&1 &
  local s=$!
  sleep 0.5
  # A stepping line starts its first 10 s with the test, as the lab's trace starts with the lab.
  touch "$dir/go"
  run_test $cli 10.99.3.1 "$t" "$file" || true
  kill $s; wait $s 2>/dev/null || true
  touch "$dir/stop"; wait $g || true
  cp "$dir/tc-stats.json" "$file.tc.json" 2>/dev/null || true
  [ -e "$dir/modem-steps.txt" ] && cp "$dir/modem-steps.txt" "$file.steps.txt"
  [ -e "$dir/rtr-rd-in.pcap" ] && cp "$dir/rtr-rd-in.pcap" "$file.rtr-rd-in.pcap" && cp "$dir/clocks.txt" "$file.clocks.txt"
  [ -e "$dir/timer-hist.txt" ] && cp "$dir/timer-hist.txt" "$file.timer.txt"
  [ -e "$dir/qdisc-samples.jsonl" ] && paste -d" " "$dir/qdisc-stamps.txt" <(paste -d" " - - < "$dir/qdisc-samples.jsonl") > "$file.qdisc.txt"
  ip netns del $cli; ip netns del $srv; rm -rf "$dir"
}

cake_opts() { # cake+opt+opt -> "opt opt"
  local o=${1#cake}; o=${o//+/ }; echo "${o# }"
}
dir_rate() { # kind rate -> the lab's per-direction settings: the link's rate, or CAKE's own
  case "$1" in
    cake*) echo "qdisc = \"cake bandwidth $2 $(cake_opts "$1")\"" ;;
    *) echo "rate = \"$2\"" ;;
  esac
}

wan_link() { # modem delay -> the lab's modem link settings
  if [ "$1" = wifi ]; then
    # The kernel's netem counts the Ethernet header (14 B) at its rate.
    echo "both = { delay = \"${2}ms\", overhead = 14, qdisc = \"fifo\", limit = 1000 }
up = { rate = \"8mbit\" }
down = { rate = \"trace:builtin:wifi\" }"
  else
    echo "both = { delay = \"${2}ms\", overhead = 18, qdisc = \"fifo\", limit = 1000 }
up = { rate = \"${1#*/}\" }
down = { rate = \"${1%/*}\" }"
  fi
}

lab_run() { # scen down up delay kind modem test file
  local down=$2 up=$3 delay=$4 kind=$5 modem=$6 t=$7 file=$8
  local q; q=$(lab_qdisc "$kind")
  local topo="$file.toml" host=10.77.0.2
  if [ -z "$modem" ]; then
    cat > "$topo" <<EOF
name = "kbench"
[[link]]
name = "wan"
a = "client"
b = "server"
both = { delay = "${delay}ms", overhead = $(lab_overhead "$kind"), $q }
up = { $(dir_rate "$kind" "$up") }
down = { $(dir_rate "$kind" "$down") }
EOF
  else
    # The shaper on the router's client link, the modem behind it (the server: the b end of link 1, counting from 0).
    host=10.77.1.2
    local lan=''
    if [ "$kind" != none ]; then
      local sdown; sdown=$(dir_rate "$kind" "$down")
      [ "${kind%%+*}" = cake ] && sdown="${sdown%\"} ingress\""
      lan="both = { overhead = $(lab_overhead "$kind"), $q }
up = { $(dir_rate "$kind" "$up") }
down = { $sdown }"
    fi
    cat > "$topo" <<EOF
name = "kbench"
[[link]]
name = "lan"
a = "client"
b = "router"
$lan
[[link]]
name = "wan"
a = "router"
b = "server"
$(wan_link "$modem" "$delay")
EOF
  fi
  "$BIN" lab run "$topo" --name kbench -- bash -c "
    '$BIN' lab exec --lab kbench server -- '$BIN' server -q > /dev/null 2>&1 &
    s=\$!; sleep 0.5
    $(declare -f run_test); $(declare -p test_args); BIN='$BIN' length='$length' cc='$cc'
    run_test bl-kbench-client $host '$t' '$file'
    '$BIN' lab stats --lab kbench --json > '$file.labstats.json'
    kill \$s; wait \$s 2>/dev/null; true" || echo "  lab run failed" >&2
}

report() { python3 - "$out" "$@" <<'PY'
import json, sys, os, statistics
out = sys.argv[1]
def load(p):
    try: return json.load(open(p))
    except Exception: return None
def cls(s, name):
    for st in s["latency_ms"]["per_stream"]:
        if st["name"].upper().endswith(name) and st.get("loaded") and st.get("idle"):
            return st["loaded"]["p50"] - st["idle"]["p50"], st["loaded"]["p90"] - st["idle"]["p50"]
    return None
def marks(v):
    if isinstance(v, dict): return sum(x for k, x in v.items() if k == "ecn_mark" and isinstance(x, int)) + sum(marks(x) for k, x in v.items() if k != "ecn_mark")
    if isinstance(v, list): return sum(marks(x) for x in v)
    return 0
def kernel_counters(tc):
    # Shaper roots on rtr (rc: towards the client = down, rd: up) and the delay box (dr: down, ds: up).
    res = {}
    # With a modem (mdm): dr towards the router = down, md = up.
    for d, devs in (("down", ("rc", "dr")), ("up", ("rd", "ds", "md"))):
        qs = [q for side in ("rtr", "mdm", "dly") for q in tc.get(side, []) if q.get("dev") in devs]
        roots = [q for q in qs if q.get("root")]
        res[d] = (sum(q["drops"] for q in roots), marks(qs))
    return res
def lab_counters(ls):
    res = {}
    for d in ("down", "up"):
        vs = [l[d] for l in ls["links"].values()]
        res[d] = (sum(sum(v["drops"].values()) for v in vs), sum(v["ecn_marks"] for v in vs))
    return res
def fmt(v, w=7): return f"{'-':>{w}}" if v is None else f"{v:>{w}.2f}"
def ratio(a, b): return f"{'-':>7}" if a is None or b is None or b == 0 else f"{a / b:>7.2f}"
cols = ["down", "up", "idle"] + [c + s for c in ("BE", "EF", "BK") for s in ("50", "90")] + ["drop_d", "drop_u", "mark_d", "mark_u"]
print("goodput Mbit/s; idle = idle RTT p50 (the kernel's includes the emulated guest's own ~1 ms);")
print("added latency (loaded p50/p90 minus idle p50) per probe class, ms; drops and ECN marks per direction")
print(f"{'scenario.test':24} {'side':6} " + " ".join(f"{c:>7}" for c in cols))
for key in sys.argv[2:]:
    rows = {}
    for side in ("kernel", "lab"):
        runs = []
        for f in sorted(os.listdir(out)):
            if f.startswith(f"{key}.{side}.") and f.endswith(".summary.json"):
                s = load(os.path.join(out, f))
                if not s: continue
                base = os.path.join(out, f[: -len(".summary.json")])
                c = load(base + ".tc.json") if side == "kernel" else load(base + ".labstats.json")
                cnt = (kernel_counters(c) if side == "kernel" else lab_counters(c)) if c else None
                runs.append((s, cnt))
        if not runs: continue
        def m(fn):
            v = [x for x in (fn(r) for r in runs) if x is not None]
            return statistics.mean(v) if v else None
        row = {"down": m(lambda r: r[0]["throughput_mbps"]["down"]), "up": m(lambda r: r[0]["throughput_mbps"]["up"]),
               "idle": m(lambda r: r[0]["latency_ms"]["idle"]["p50"] if r[0]["latency_ms"]["idle"] else None)}
        for c in ("BE", "EF", "BK"):
            row[c + "50"] = m(lambda r: (cls(r[0], c) or (None, None))[0])
            row[c + "90"] = m(lambda r: (cls(r[0], c) or (None, None))[1])
        for d, i, name in (("down", 0, "drop_d"), ("up", 0, "drop_u"), ("down", 1, "mark_d"), ("up", 1, "mark_u")):
            row[name] = m(lambda r: r[1][d][i] if r[1] else None)
        rows[side] = row
        print(f"{key:24} {side:6} " + " ".join(fmt(row[c]) for c in cols) + f"  n={len(runs)}")
    if len(rows) == 2:
        k, l = rows["kernel"], rows["lab"]
        print(f"{key:24} {'ratio':6} " + " ".join(ratio(l[c], k[c]) if c != "idle" else f"{'':>7}" for c in cols))
PY
}

steps_report() { python3 - "$out" "$@" <<'PY'
# Per phase of the line's rate step, from each run's own goodput: the download summed over its
# flows, over 0.5 s, falls under 20 Mbit/s when the line drops to 10 and rises over it when the
# line is back at 40 (until it drops again). Probe RTT p50 (best effort) per phase, ms.
import gzip, json, os, statistics, sys
out = sys.argv[1]
def phases(r):
    load = next(p for p in r["metadata"]["phases"] if p["name"] != "idle")
    down = [s for s in r["series"] if s["kind"] == "throughput" and s.get("direction") == "down"]
    total = {}
    for s in down:
        for t, v in s["samples"]:
            if v is not None: total[round(t, 3)] = total.get(round(t, 3), 0.0) + v
    ts = sorted(total)
    smooth = [(t, statistics.mean(total[u] for u in ts if t - 0.5 < u <= t)) for t in ts if t >= load["start"] + 2]
    slow = next((t for t, g in smooth if g < 20), None)
    if slow is None: return None
    fast = next((t for t, g in smooth if t > slow + 2 and g > 20), load["end"])
    again = next((t for t, g in smooth if t > fast + 2 and g < 20), load["end"])
    return [("40 Mbit/s", load["start"] + 2, slow), ("first 3 s at 10", slow, slow + 3), ("rest at 10", slow + 3, fast), ("back at 40", fast, again)]
def p50(r, lo, hi):
    v = [x for s in r["series"] if s["name"].startswith("rtt ") and (s.get("dscp") or 0) == 0 for t, x in s["samples"] if lo <= t < hi and x is not None]
    return statistics.median(v) if v else None
print("probe RTT p50 per phase of the rate step, ms (best effort; phases from the run's goodput)")
print(f"{'scenario.test':24} {'side':6} {'idle':>7} {'40 Mbit/s':>10} {'first 3 s at 10':>16} {'rest at 10':>11} {'back at 40':>11}")
for key in sys.argv[2:]:
    for side in ("kernel", "lab"):
        for f in sorted(os.listdir(out)):
            if not (f.startswith(f"{key}.{side}.") and f.endswith(".json.gz")): continue
            r = json.load(gzip.open(os.path.join(out, f)))
            ph = phases(r)
            idle = r["summary"]["latency_ms"]["idle"]["p50"] if r.get("summary") and r["summary"]["latency_ms"].get("idle") else None
            cells = [p50(r, lo, hi) for _, lo, hi in ph] if ph else []
            fmt = lambda v, w: f"{'-':>{w}}" if v is None else f"{v:>{w}.1f}"
            print(f"{key:24} {side:6} {fmt(idle, 7)} " + " ".join(fmt(v, w) for v, w in zip(cells, (10, 16, 11, 11))) + ("" if ph else "  (no step found)"))
PY
}

estimate_report() { # kernel run files with a capture: Linux's estimate against the model's
  local replay=target/release/examples/autorate_replay
  [ -x "$replay" ] || cargo build --release --quiet -p bloatlab-lab-model --example autorate_replay
  echo "autorate-ingress capacity estimate per step of the line, Mbit/s p50: Linux's (tc -s samples) and"
  echo "the lab's model fed the arrivals captured at Linux's router (|diff| is the median gap, same instants;"
  echo "steps with traffic only)"
  local f
  for f in "$@"; do
    "$replay" "$f.rtr-rd-in.pcap" "bandwidth 38mbit besteffort autorate-ingress ingress" 250 > "$f.replay.txt"
    python3 - "$f" <<'PY'
import bisect, json, statistics, sys
f = sys.argv[1]
boot, real = map(float, open(f + ".clocks.txt").read().split())
to_real = lambda up: up - boot + real
steps = [l.split() for l in open(f + ".steps.txt")]
edges = [(to_real(int(cs) / 100), rate) for cs, rate in steps]
edges[0] = (edges[0][0], "40mbit")
dec = json.JSONDecoder()
linux = []
for line in open(f + ".qdisc.txt"):
    stamp, rest = line.split(" ", 1)
    cake = [q for q in dec.raw_decode(rest.strip())[0] if q.get("kind") == "cake"]
    if cake: linux.append((to_real(float(stamp)), cake[0]["capacity_estimate"] * 8 / 1e6))
# (capture clock, Mbit/s arrived in the step, estimate): idle steps (the test's idle phase) left out.
model = [tuple(map(float, l.split()[1:4])) for l in open(f + ".replay.txt") if not l.startswith("t_s")]
clock = [m[0] for m in model]
print(f"  {f.rsplit('/', 1)[-1]}")
for i, (lo, rate) in enumerate(edges):
    hi = edges[i + 1][0] if i + 1 < len(edges) else float("inf")
    pairs = []
    for t, est in linux:
        j = bisect.bisect_left(clock, t)
        if lo <= t < hi and j < len(model) and abs(clock[j] - t) < 0.3 and model[j][1] > 1:
            pairs.append((est, model[j][2]))
    if not pairs: continue
    lx, md = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    gap = statistics.median(abs(a - b) for a, b in pairs)
    print(f"    line {rate:>7} from {lo - edges[0][0]:5.1f} s: Linux {lx:5.1f}  model {md:5.1f}  |diff| {gap:4.1f}  ({len(pairs)} samples)")
PY
  done
}

keys=()
steps=()
while read -r name down up delay kind modem; do
  [ -z "$name" ] && continue
  if [ ${#pick[@]} -gt 0 ] && ! printf '%s\n' "${pick[@]}" | grep -qx "$name"; then continue; fi
  for t in $tests; do
    for r in $(seq "$repeat"); do
      [ $report_only = 1 ] && break
      echo "== $name $t run $r: kernel" >&2
      kernel_run "$name" "$down" "$up" "$delay" "$kind" "$modem" "$t" "$out/$name.$t.kernel.$r"
      echo "== $name $t run $r: lab" >&2
      lab_run "$name" "$down" "$up" "$delay" "$kind" "$modem" "$t" "$out/$name.$t.lab.$r"
    done
    keys+=("$name.$t")
    [ "$modem" = wifi ] && steps+=("$name.$t")
  done
done <<< "$SCENARIOS"
report "${keys[@]}" | tee "$out/report.txt"
[ ${#steps[@]} -eq 0 ] || steps_report "${steps[@]}" | tee -a "$out/report.txt"
captured=()
for k in "${steps[@]}"; do
  for f in "$out/$k".kernel.*.rtr-rd-in.pcap; do [ -e "$f" ] && captured+=("${f%.rtr-rd-in.pcap}"); done
done
[ ${#captured[@]} -eq 0 ] || estimate_report "${captured[@]}" | tee -a "$out/report.txt"
