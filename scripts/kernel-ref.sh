#!/usr/bin/env bash
# Runs a command as root inside Debian's own kernel (cake, fq_codel, netem, htb, ifb ...),
# booted under qemu, over a read-only view of this machine's file system: the guest runs this
# machine's own bloatlab, tc, ip and iperf3. See ../shared/reference/kernel-reference.md.
#
#   scripts/kernel-ref.sh [--out DIR] [--timeout S] [--tap NAME@NS]... -- COMMAND...
#   scripts/kernel-ref.sh --prepare        # fetch the kernel, build the initramfs, exit
#
# COMMAND is a shell command line, run by /bin/sh in the guest with KREF_OUT=DIR, in the
# caller's working directory when the guest can see it (DIR otherwise). This machine's `/` is
# visible read-only at the same paths; DIR (default ./kernel-ref-out) is writable at the same
# path, so results land where the caller looks. The guest's /run and /var/tmp are empty tmpfs;
# its /tmp shows this machine's /tmp with writes kept in the guest's memory (an overlay). The exit code is COMMAND's; 124 when it ran past --timeout; 125 when the harness
# itself failed (one line on stderr says why).
#
# Router mode: each --tap NAME@NS gives the guest one virtio-net NIC (eth0, eth1, ... in order)
# whose host end is a tap device NAME, moved into this machine's namespace NS (which must exist)
# and set up there once qemu has made it; its addresses are the caller's to set. Offloads are off
# on both ends, so every frame is one wire packet. COMMAND then usually configures the guest as
# a router between the NICs and waits (scripts/kernel-ref-topo.sh does both).
#
# Cache: $KERNEL_REF_CACHE (default ~/.cache/bloatlab-kernel-ref) keeps the kernel and the
# initramfs; nothing else is left behind but DIR. $KERNEL_REF_PACKAGE names another kernel
# package than linux-image-amd64's; $KERNEL_REF_APPEND adds to the kernel command line.
# $KERNEL_REF_SMP sets the guest's CPUs (default 2); $KERNEL_REF_RT=N runs qemu at real-time
# priority SCHED_RR N where the caller may set it (root; default 0: as the caller runs).
set -uo pipefail

out=./kernel-ref-out
timeout_s=300
boot_timeout_s=${KERNEL_REF_BOOT_TIMEOUT:-60}
taps=()
prepare_only=0
cache=${KERNEL_REF_CACHE:-${HOME:-/root}/.cache/bloatlab-kernel-ref}
mem=${KERNEL_REF_MEM:-1024}

die() { echo "kernel-ref: $*" >&2; exit 125; }
usage() { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --timeout) timeout_s=${2:?--timeout needs seconds}; shift 2 ;;
    --tap) taps+=("${2:?--tap needs NAME@NS}"); shift 2 ;;
    --prepare) prepare_only=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) echo "kernel-ref: unknown option $1" >&2; usage ;;
  esac
done
[ $prepare_only = 1 ] || [ $# -gt 0 ] || { echo "kernel-ref: no COMMAND after --" >&2; usage; }
case "$timeout_s" in ''|*[!0-9]*) die "--timeout wants whole seconds, got '$timeout_s'" ;; esac
[ "$(id -u)" = 0 ] || die "needs root (qemu's tap devices, apt-get for what is missing)"

# The kernel's modules the guest loads, dependencies resolved from modules.dep.
MODULES="virtio_pci 9pnet_virtio 9p overlay virtio_net
  sch_cake sch_netem sch_htb sch_codel sch_fq_codel sch_fq sch_tbf sch_prio sch_ingress sch_hfsc
  sch_sfq sch_red sch_pie cls_u32 cls_fw cls_matchall cls_flow act_mirred act_skbedit ifb veth tun"

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 && return 0
  apt-get update -qq >/dev/null 2>&1
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1
}

ensure_tools() {
  local need=()
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  [ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -x insmod >/dev/null || need+=(busybox-static)
  command -v cpio >/dev/null || need+=(cpio)
  command -v depmod >/dev/null || need+=(kmod)
  [ ${#need[@]} = 0 ] && return 0
  apt_install "${need[@]}" || die "cannot install ${need[*]} from the package index (apt-get install failed)"
  command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 still missing after installing qemu-system-x86"
}

# Debian's kernel package, downloaded and unpacked (not installed) into the cache.
ensure_kernel() {
  local cur="$cache/current"
  # Bump FORMAT when the initramfs changes: a cache of another format is rebuilt.
  local FORMAT=3
  if [ -f "$cur/vmlinuz" ] && [ -f "$cur/initrd.cpio.gz" ] && [ "$(cat "$cur/format" 2>/dev/null)" = $FORMAT ]; then return 0; fi
  mkdir -p "$cache" || die "cannot create cache $cache"
  kwork=$(mktemp -d "$cache/build.XXXXXX") || die "cannot write to $cache"
  local work=$kwork
  local pkg=${KERNEL_REF_PACKAGE:-}
  [ -n "$pkg" ] || pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  if [ -z "$pkg" ]; then
    apt-get update -qq >/dev/null 2>&1
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  fi
  [ -n "$pkg" ] || die "cannot find Debian's kernel package (apt-cache depends linux-image-amd64 names none)"
  # Name one package: a glob would fetch every old version too.
  (cd "$work" && apt-get download "$pkg" >/dev/null 2>&1) || die "cannot fetch the kernel package $pkg (apt-get download failed)"
  dpkg-deb -x "$work"/*.deb "$work/root" || die "cannot unpack $pkg"
  local ver; ver=$(ls "$work/root/lib/modules" | head -n1)
  [ -n "$ver" ] && [ -f "$work/root/boot/vmlinuz-$ver" ] || die "$pkg holds no kernel image"
  depmod -b "$work/root" "$ver" || die "depmod failed for $ver"
  local mdir="$work/root/lib/modules/$ver"

  # Load order: each module after its dependencies.
  declare -A seen=()
  local order=()
  add_mod() {
    local name=$1 line path deps d
    line=$(grep -E "(^|/)${name//_/[_-]}\.ko(\.[a-z]+)?:" "$mdir/modules.dep" | head -n1)
    [ -n "$line" ] || { grep -q "/${name}.ko" "$mdir/modules.builtin" 2>/dev/null && return 0; die "module $name is in neither modules.dep nor modules.builtin of $ver"; }
    path=${line%%:*}
    [ -n "${seen[$path]:-}" ] && return 0
    seen[$path]=1
    deps=${line#*:}
    for d in $deps; do add_mod "$(basename "${d%%.ko*}")"; done
    order+=("$path")
  }
  local m
  for m in $MODULES; do add_mod "$m"; done

  local ird="$work/initrd"
  mkdir -p "$ird"/{bin,dev,proc,sys,newroot,mods}
  cp /bin/busybox "$ird/bin/busybox"
  local i=0 p
  : > "$ird/mods/order"
  for p in "${order[@]}"; do
    i=$((i + 1))
    local f; f=$(printf '%03d-%s' "$i" "$(basename "$p")")
    case "$p" in
      *.xz) xz -dc "$mdir/$p" > "$ird/mods/${f%.xz}"; f=${f%.xz} ;;
      *.zst) zstd -qdc "$mdir/$p" > "$ird/mods/${f%.zst}"; f=${f%.zst} ;;
      *) cp "$mdir/$p" "$ird/mods/$f" ;;
    esac
    echo "$f" >> "$ird/mods/order"
  done
  cat > "$ird/init" <<'INIT'
#!/bin/busybox sh
# Guest init: load modules, mount this machine's / (9p, read-only) and the job's shares, run
# the job chrooted into it, record its exit code, power off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod /mods/$m 2>/dev/null; done
fail() { echo "kref-init: $*"; echo "$*" > /ctl/init-error 2>/dev/null; poweroff -f; }
mkdir -p /ctl
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 ctl /ctl || fail "cannot mount the control share"
touch /ctl/booted
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro host /newroot || fail "cannot mount the host root"
R=/newroot
mount -t proc proc $R/proc && mount -t sysfs sys $R/sys && mount -t devtmpfs dev $R/dev || fail "cannot mount proc/sys/dev"
mount -t devpts devpts $R/dev/pts 2>/dev/null
for d in /run /var/tmp; do mount -t tmpfs tmpfs $R$d || fail "cannot mount tmpfs on $d"; done
# /tmp: this machine's files stay visible (a checkout or DIR may live there), writes go to memory.
mkdir -p /ovl && mount -t tmpfs tmpfs /ovl && mkdir /ovl/up /ovl/work
mount -t overlay overlay -o lowerdir=$R/tmp,upperdir=/ovl/up,workdir=/ovl/work $R/tmp || fail "cannot mount the /tmp overlay"
mkdir -p $R/run/kref-ctl && mount --move /ctl $R/run/kref-ctl || fail "cannot move the control share"
. $R/run/kref-ctl/env
mkdir -p "$R$KREF_OUT" 2>/dev/null
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out "$R$KREF_OUT" || fail "cannot mount $KREF_OUT"
chroot $R /bin/sh /run/kref-ctl/job > $R/run/kref-ctl/stdout 2> $R/run/kref-ctl/stderr
echo $? > $R/run/kref-ctl/rc
sync
poweroff -f
INIT
  chmod +x "$ird/init"
  (cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initrd.cpio.gz" || die "cannot build the initramfs"
  local new="$cache/$ver"
  rm -rf "$new"; mkdir -p "$new"
  cp "$work/root/boot/vmlinuz-$ver" "$new/vmlinuz"
  # The uncompressed kernel boots straight into 64-bit code through its PVH entry: it skips
  # SeaBIOS's real-mode loader and the decompressor, about 5 s of the boot under emulation.
  unpack_vmlinux "$new/vmlinuz" "$new/vmlinux" || rm -f "$new/vmlinux"
  mv "$work/initrd.cpio.gz" "$new/initrd.cpio.gz"
  echo "$ver" > "$new/version"
  echo $FORMAT > "$new/format"
  ln -sfn "$ver" "$cur"
  rm -rf "$kwork"; kwork=
}

# The ELF kernel inside a bzImage (xz, zstd or gzip payload), if it has a PVH entry note.
unpack_vmlinux() { # bzImage out
  local sig tool off
  for sig in '\xfd7zXZ\x00:xz -dc --single-stream' '\x28\xb5\x2f\xfd:zstd -qdc' '\x1f\x8b\x08\x00:gzip -dc'; do
    tool=${sig#*:}
    command -v "${tool%% *}" >/dev/null || continue
    off=$(LC_ALL=C grep -obUaP "${sig%%:*}" "$1" | head -n1 | cut -d: -f1)
    [ -n "$off" ] || continue
    tail -c +$((off + 1)) "$1" | $tool > "$2" 2>/dev/null
    # PVH: the Xen ELF note type 18 (XEN_ELFNOTE_PHYS32_ENTRY) that qemu's -kernel looks for.
    [ "$(head -c 4 "$2")" = $'\x7fELF' ] && LC_ALL=C readelf -n "$2" 2>/dev/null | grep 'Unknown note type: (0x00000012)' >/dev/null && return 0
  done
  return 1
}

kwork= ctl= qpid= t1= t2=
cleanup() {
  [ -n "$qpid" ] && kill "$qpid" 2>/dev/null && wait "$qpid" 2>/dev/null
  [ -n "$t1" ] && wait "$t1" "$t2" 2>/dev/null
  [ -n "$ctl" ] && rm -rf "$ctl"
  [ -n "$kwork" ] && rm -rf "$kwork"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ensure_tools
ensure_kernel
[ $prepare_only = 1 ] && { echo "kernel-ref: ready: $(cat "$cache/current/version") in $cache"; exit 0; }

mkdir -p "$out" || die "cannot create $out"
out=$(cd "$out" && pwd -P)
ctl=$(mktemp -d /tmp/bloatlab-kref.XXXXXX) || die "cannot make a temporary directory"

# The job runs where the caller is, unless the guest's fresh tmpfs hides that place.
wd=$(pwd -P)
case "$wd/" in /run/*|/var/tmp/*) wd=$out ;; esac
{
  printf 'KREF_OUT=%q\n' "$out"
} > "$ctl/env"
{
  echo "export KREF_OUT=$(printf '%q' "$out") PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root"
  echo "cd $(printf '%q' "$wd") || exit 125"
  printf '%s\n' "$*"
} > "$ctl/job"

net=()
i=0
for t in "${taps[@]}"; do
  name=${t%@*}; ns=${t#*@}
  [ -n "$name" ] && [ -n "$ns" ] && [ "$name" != "$t" ] || die "--tap wants NAME@NS, got '$t'"
  ip netns list | awk '{print $1}' | grep -qx "$ns" || die "--tap $t: no namespace $ns"
  # No offloads negotiated: the tap then hands over, and receives, one wire packet per frame.
  net+=(-netdev "tap,id=n$i,ifname=$name,script=no,downscript=no"
        -device "virtio-net-pci,netdev=n$i,mac=52:54:00:00:00:$(printf %02x $((i + 1))),csum=off,guest_csum=off,gso=off,host_tso4=off,host_tso6=off,host_ecn=off,host_ufo=off,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off,mrg_rxbuf=off")
  i=$((i + 1))
done
[ ${#taps[@]} -gt 0 ] || net=(-nic none)

pin=(); [ -n "${KERNEL_REF_CPUS:-}" ] && pin=(taskset -c "$KERNEL_REF_CPUS")
# Real-time priority (KERNEL_REF_RT: SCHED_RR, under the lab's forwarders at SCHED_FIFO 10):
# the guest's timers are its qdiscs' clock, and beside a busy process of normal priority they
# fell behind (CAKE's splits 1.30-1.39:1 where the lab's read 1.04; rrul through its CAKE
# +19.7 ms, under 15 alone); at RR 5, 1.12:1 and rrul passed. TCG's vCPU threads sleep while
# the guest is idle, but each busy one holds a core: with two, the processes beside it starve
# (the tests use one, KERNEL_REF_SMP=1).
rt=${KERNEL_REF_RT:-0}
case "$rt" in *[!0-9]*|'') die "KERNEL_REF_RT must be a priority 1-99 or 0, got '$rt'" ;; esac
[ "$rt" != 0 ] && chrt -r "$rt" true 2>/dev/null && pin=(chrt -r "$rt" "${pin[@]}")
kernel=$cache/current/vmlinuz
[ -f "$cache/current/vmlinux" ] && kernel=$cache/current/vmlinux
"${pin[@]}" qemu-system-x86_64 -accel tcg,thread=multi -smp "${KERNEL_REF_SMP:-2}" -m "$mem" -no-reboot -nographic -nodefaults \
  -serial "file:$ctl/console" -monitor none \
  -kernel "$kernel" -initrd "$cache/current/initrd.cpio.gz" \
  -append "console=ttyS0 quiet panic=-1 rdinit=/init ${KERNEL_REF_APPEND:-}" \
  -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on \
  -virtfs "local,path=$ctl,mount_tag=ctl,security_model=none" \
  -virtfs "local,path=$out,mount_tag=out,security_model=none" \
  "${net[@]}" > "$ctl/qemu.log" 2>&1 &
qpid=$!

# Router mode: move each tap into its namespace as soon as qemu has made it.
for t in "${taps[@]}"; do
  name=${t%@*}; ns=${t#*@}
  for _ in $(seq 100); do ip link show "$name" >/dev/null 2>&1 && break; kill -0 $qpid 2>/dev/null || break; sleep 0.05; done
  ip link set "$name" netns "$ns" 2>/dev/null || die "qemu did not create tap $name ($(tail -n1 "$ctl/qemu.log" 2>/dev/null))"
  ip -n "$ns" link set "$name" up
  ip netns exec "$ns" ethtool -K "$name" tso off gso off gro off tx off rx off >/dev/null 2>&1
done

# The job's output, live; each tail prints what is left and ends once qemu has.
touch "$ctl/stdout" "$ctl/stderr"
tail -s 0.2 -n +1 -f --pid=$qpid "$ctl/stdout" &
t1=$!
tail -s 0.2 -n +1 -f --pid=$qpid "$ctl/stderr" >&2 &
t2=$!

# The console line that says why a guest stopped: a panic if there was one, else the last line.
console_reason() {
  grep -a -m1 -o 'Kernel panic.*' "$ctl/console" 2>/dev/null || tail -n1 "$ctl/console" 2>/dev/null | tr -d '\r'
}

start=$SECONDS
booted=0
while kill -0 $qpid 2>/dev/null; do
  if [ $booted = 0 ] && [ -e "$ctl/booted" ]; then booted=1; fi
  if [ $booted = 0 ] && [ $((SECONDS - start)) -ge "$boot_timeout_s" ]; then
    die "the guest did not boot within ${boot_timeout_s} s (console: $(console_reason))"
  fi
  if [ $((SECONDS - start)) -ge "$timeout_s" ]; then
    echo "kernel-ref: the job ran past its timeout of ${timeout_s} s and was stopped" >&2
    exit 124
  fi
  sleep 0.2
done
wait $qpid; qrc=$?
qpid=
qmsg=$(tail -n1 "$ctl/qemu.log" 2>/dev/null)
wait $t1 $t2
if [ -s "$ctl/rc" ]; then
  exit "$(cat "$ctl/rc")"
fi
if [ -s "$ctl/init-error" ]; then die "the guest booted but $(cat "$ctl/init-error")"; fi
if [ ! -e "$ctl/booted" ]; then
  die "the guest did not boot (qemu exit $qrc${qmsg:+: $qmsg}; console: $(console_reason))"
fi
die "the guest stopped before the job finished (qemu exit $qrc; console: $(console_reason))"
