#!/usr/bin/env bash
# A real systemd as PID 1 of private PID, mount, UTS, IPC, network and cgroup namespaces, over a
# tmpfs-backed overlay of `/`: every write of the boot (packages installed, units enabled,
# /var/lib, /etc) lands in tmpfs and vanishes at power-off. For the service tests; works where
# the host's PID 1 is not systemd (a CI container, a VM booted by something else).
#
#   container.sh up DIR       boot; DIR (empty or missing) keeps the state; prints the init pid
#   container.sh exec DIR CMD run CMD inside (systemctl, journalctl, dpkg, hugeprep ...)
#   container.sh down DIR     power off, wait, remove the cgroups; idempotent
#   container.sh copy DIR SRC DEST   copy a host file into the container's overlay
#
# What the host keeps unchanged: /proc/sys is read-only inside (systemd-sysctl would change the
# host's settings), /sys is read-only except /sys/kernel/mm/hugepages (the daemon's pools: tests
# hand it pages they reserved themselves and set `reserve = false`), /dev is a minimal tmpfs
# (no udev), the network is a private loopback. Needs the hybrid or unified cgroup layout and
# root. Pitfalls handled here: a process entering from outside must leave the container's
# cgroups before the PID namespace is joined (systemd fails to enumerate "pid 0" members
# otherwise), and systemd must run a minimal target (multi-user.target would start every
# service of the host image).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:?usage: container.sh up|exec|down|copy DIR ...}
dir=${2:?usage: container.sh $cmd DIR ...}
shift 2

# cgroup hierarchies the container gets a subtree of: name=systemd (v1, hybrid) and cgroup2.
cgroup_roots() {
    if [ -d /sys/fs/cgroup/unified ] && [ -d /sys/fs/cgroup/systemd ]; then
        echo /sys/fs/cgroup/systemd /sys/fs/cgroup/unified
    else
        echo /sys/fs/cgroup
    fi
}
cgname() { echo "hugeprep-sdtest-$(basename "$dir")"; }

case "$cmd" in
up)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    rm -f "$dir"/init.pid "$dir"/console.log
    for r in $(cgroup_roots); do mkdir -p "$r/$(cgname)"; done
    # `script` gives systemd a pty as /dev/console and copies what it prints to console.log.
    setsid script -qfec "$here/container.sh boot $dir" "$dir/console.log" \
        </dev/null >/dev/null 2>&1 &
    echo $! >"$dir/script.pid"
    for _ in $(seq 1 300); do
        [ -s "$dir/init.pid" ] && break
        sleep 0.05
    done
    [ -s "$dir/init.pid" ] || { echo "container.sh: no init after 15 s" >&2; cat "$dir/console.log" >&2; exit 1; }
    for _ in $(seq 1 600); do
        st=$("$here/container.sh" exec "$dir" systemctl is-system-running 2>/dev/null) || true
        case "$st" in running | degraded) cat "$dir/init.pid"; exit 0 ;; esac
        sleep 0.05
    done
    echo "container.sh: systemd did not reach running (state: ${st:-none})" >&2
    cat "$dir/console.log" >&2
    exit 1
    ;;
boot)
    # Runs under `script`, on the pty. Capabilities the container never needs are dropped.
    export SD_CONSOLE SD_DIR="$dir"
    SD_CONSOLE=$(tty)
    exec setpriv --bounding-set=-sys_module,-sys_time,-sys_boot,-sys_rawio \
        unshare --pid --fork --mount --uts --ipc --net --propagation private \
        "$here/container.sh" stage1 "$dir"
    ;;
stage1)
    # PID 1 of the new PID namespace, still in the host's cgroup namespace and with the host's
    # /proc mounted: awk's parent, seen from there, is this shell's pid on the host, which stays
    # the pid of systemd (every step below execs).
    awk '{print $4}' /proc/self/stat >"$dir/init.pid.new"
    mv "$dir/init.pid.new" "$dir/init.pid"
    O=$dir/ovl
    R=$O/root
    mkdir -p "$O"
    mount -t tmpfs -o mode=755 sdovl "$O"
    mkdir -p "$O/upper" "$O/work" "$R"
    mount -t overlay sdroot -o "lowerdir=/,upperdir=$O/upper,workdir=$O/work" "$R"
    # The container is a machine hugeprep was never installed on: state, configuration and a
    # hook the host keeps (a daemon run there by hand, the README's quick start) would show
    # through the overlay and pass for the package's own. Whiteouts in the upper layer hide
    # them; the host's files are untouched.
    rm -rf "$R/var/lib/hugeprep" "$R/etc/hugeprep" "$R/etc/libvirt/hooks/qemu.d/hugeprep"
    mount -t proc proc "$R/proc"
    mount --bind "$R/proc/sys" "$R/proc/sys"
    mount -o remount,bind,ro "$R/proc/sys"
    mount -t sysfs -o ro sysfs "$R/sys"
    mount --bind /sys/kernel/mm/hugepages "$R/sys/kernel/mm/hugepages"
    mount -o remount,bind,rw "$R/sys/kernel/mm/hugepages"
    # Per-node pools live under /sys/devices/system/node: writable too.
    if [ -d /sys/devices/system/node ]; then
        mount --bind /sys/devices/system/node "$R/sys/devices/system/node"
        mount -o remount,bind,rw "$R/sys/devices/system/node"
    fi
    for r in $(cgroup_roots); do echo $$ >"$r/$(cgname)/cgroup.procs"; done
    exec unshare --cgroup "$here/container.sh" stage2 "$dir"
    ;;
stage2)
    O=$dir/ovl
    R=$O/root
    mount -t tmpfs -o mode=755 cgroup "$R/sys/fs/cgroup"
    if [ "$(cgroup_roots)" = /sys/fs/cgroup ]; then
        mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup"
    else
        mkdir "$R/sys/fs/cgroup/systemd" "$R/sys/fs/cgroup/unified"
        mount -t cgroup -o none,name=systemd,xattr cgroup "$R/sys/fs/cgroup/systemd"
        mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup/unified"
        mount -o remount,ro,bind "$R/sys/fs/cgroup" || true
    fi
    mount -t tmpfs -o mode=755,nosuid devtmp "$R/dev"
    for n in null zero full random urandom tty; do
        touch "$R/dev/$n"
        mount --bind "/dev/$n" "$R/dev/$n"
    done
    mkdir -p "$R/dev/pts" "$R/dev/shm" "$R/dev/mqueue" "$R/dev/hugepages"
    mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$R/dev/pts"
    ln -s pts/ptmx "$R/dev/ptmx"
    ln -s /proc/self/fd "$R/dev/fd"
    ln -s /proc/self/fd/0 "$R/dev/stdin"
    ln -s /proc/self/fd/1 "$R/dev/stdout"
    ln -s /proc/self/fd/2 "$R/dev/stderr"
    mount -t tmpfs -o mode=1777 shm "$R/dev/shm"
    touch "$R/dev/console"
    mount --bind "$SD_CONSOLE" "$R/dev/console"
    mount -t tmpfs -o mode=755,nosuid,nodev run "$R/run"
    mount -t tmpfs -o mode=1777,nosuid,nodev tmp "$R/tmp"
    # The host's /etc may have units enabled that need hardware; the container boots only this.
    mkdir -p "$R/etc/systemd/system"
    cat >"$R/etc/systemd/system/hugeprep-test.target" <<'EOF'
[Unit]
Description=hugeprep service tests: sysinit, journald, sockets
Requires=sysinit.target systemd-journald.socket
After=sysinit.target
AllowIsolate=yes
EOF
    mkdir -p "$R/oldroot"
    cd "$R"
    pivot_root . oldroot
    umount -l /oldroot
    rmdir /oldroot
    exec env -i container=other TERM=dumb /lib/systemd/systemd --system --unit=hugeprep-test.target
    ;;
exec)
    init=$(cat "$dir/init.pid")
    # Leave the host's cgroup for the container's root cgroup, then join its cgroup namespace.
    exec nsenter -t "$init" -m -u -i -n -p -- /bin/sh -c '
        for r in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified /sys/fs/cgroup; do
            [ -w "$r/cgroup.procs" ] && echo $$ >"$r/cgroup.procs" 2>/dev/null
        done
        exec nsenter -t 1 -C -- "$@"' sh "$@"
    ;;
copy)
    init=$(cat "$dir/init.pid")
    src=${1:?copy SRC DEST}
    dest=${2:?copy SRC DEST}
    cp "$src" "/proc/$init/root$dest"
    ;;
down)
    if [ -s "$dir/init.pid" ]; then
        init=$(cat "$dir/init.pid")
        spid=$(cat "$dir/script.pid" 2>/dev/null || echo 0)
        kill -s SIGRTMIN+4 "$init" 2>/dev/null || true
        for _ in $(seq 1 200); do
            kill -0 "$init" 2>/dev/null || break
            sleep 0.05
        done
        if kill -0 "$init" 2>/dev/null; then
            echo "container.sh: init $init still running after 10 s, SIGKILL" >&2
            kill -9 "$init" 2>/dev/null || true
            sleep 0.5
        fi
        for _ in $(seq 1 100); do
            [ "$spid" != 0 ] && kill -0 "$spid" 2>/dev/null || break
            sleep 0.05
        done
        rm -f "$dir/init.pid"
    fi
    for r in $(cgroup_roots); do
        [ -d "$r/$(cgname)" ] && find "$r/$(cgname)" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
    true
    ;;
*)
    echo "container.sh: unknown command $cmd" >&2
    exit 2
    ;;
esac
