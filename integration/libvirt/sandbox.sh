#!/usr/bin/env bash
# A private libvirtd + virtlogd for tests and benchmarks, leaving the host's libvirt alone.
#
#   sandbox.sh up DIR MEMORY_BACKING_DIR [HOOK_COMMAND]
#   sandbox.sh restart-libvirtd DIR
#   sandbox.sh stop-libvirtd DIR       (domains keep running)
#   sandbox.sh start-libvirtd DIR
#   sandbox.sh down DIR
#
# `up` runs both daemons (as root, not under systemd) in a private mount namespace in which
# /etc/libvirt, /run/libvirt, /var/lib/libvirt, /var/log/libvirt and /var/cache/libvirt are
# bind mounts of DIR/{etc,run,lib,log,cache}: the host's files are never written, and the
# namespace disappears with its last process. qemu.conf is the package's own
# (/etc/libvirt/qemu.conf as the distribution ships it: QEMU runs as its unprivileged user
# with dynamic ownership, its private /dev and a cgroup per domain) plus what
# integration/libvirt/qemu.conf.snippet tells operators to add: `memory_backing_dir` set to
# MEMORY_BACKING_DIR and `hugetlbfs_mount` to the hugetlbfs mount holding it (else libvirt
# claims every hugetlbfs mount). HOOK_COMMAND, when given, is installed as
# /etc/libvirt/hooks/qemu.d/hugeprep before libvirtd starts (libvirt only looks for hooks at
# start). /dev/kvm is made root:kvm 0660, as udev makes it on a real host (a host without
# udev leaves it root 0600, which only a QEMU run as root can open). Connect with:
#
#   virsh -c "qemu:///system?socket=DIR/run/libvirt-sock" ...
#
# HUGEPREP_SANDBOX_HOST_UUID, when set at `up`, is libvirtd's host_uuid (two sandboxes as two
# hosts for a migration). HUGEPREP_SANDBOX_QEMU_USER and HUGEPREP_SANDBOX_QEMU_GROUP, when set,
# are qemu.conf's `user` and `group` (QEMU as root; another distribution's user).
#
# `down` destroys every domain, stops both daemons by their pid files, kills any QEMU left
# (by the pid files libvirt wrote) and removes DIR.
set -euo pipefail

die() { echo "sandbox.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root (libvirtd runs as root)"
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: sandbox.sh up|restart-libvirtd|stop-libvirtd|start-libvirtd|down DIR [...]"

uri="qemu:///system?socket=$dir/run/libvirt-sock"
virsh_() { virsh -q -c "$uri" "$@"; }

# Runs "$@" inside the sandbox's mount namespace (the one virtlogd lives in).
in_ns() {
    local pid
    pid=$(cat "$dir/virtlogd.pid" 2>/dev/null) || die "no virtlogd.pid in $dir (is it up?)"
    nsenter --mount="/proc/$pid/ns/mnt" -- "$@"
}

# Waits until `test -S socket` succeeds (a liveness bound, 30 s).
wait_socket() {
    local i
    for i in $(seq 300); do
        [ -S "$1" ] && return 0
        sleep 0.1
    done
    die "no socket $1 after 30 s; see $dir/log"
}

start_libvirtd() {
    rm -f "$dir/run/libvirt-sock"
    in_ns libvirtd -d -p "$dir/libvirtd.pid" -f /etc/libvirt/libvirtd.conf
    wait_socket "$dir/run/libvirt-sock"
    # The socket exists before the driver finished loading: wait for an answer.
    local i
    for i in $(seq 300); do
        virsh_ version >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "libvirtd does not answer on $uri; see $dir/log/libvirtd.log"
}

# Stops the processes named by the pid files given, all at once (each daemon takes about 2 s
# to shut down), SIGKILL after 10 s.
stop_pidfile() {
    local f pid pids=() i alive
    for f in "$@"; do
        # A pid file may go between the glob and here (libvirtd removes its QEMU driver's
        # driver.pid as the TERM to libvirtd above takes effect).
        pid=$(cat "$f" 2>/dev/null) || continue
        rm -f "$f"
        if [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; then
            pids+=("$pid")
        fi
    done
    for i in $(seq 100); do
        alive=0
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        [ "$alive" -eq 1 ] || return 0
        sleep 0.1
    done
    for pid in "${pids[@]}"; do
        kill -KILL "$pid" 2>/dev/null || true
    done
}

case "$cmd" in
up)
    backing=${3:-}
    hook=${4:-}
    [ -n "$backing" ] || die "up needs MEMORY_BACKING_DIR"
    mkdir -p "$backing"
    mount=$(findmnt -n -o TARGET -T "$backing") || die "$backing is on no mount"
    [ "$(findmnt -n -o FSTYPE -T "$backing")" = hugetlbfs ] ||
        die "$backing is not on a hugetlbfs mount"
    [ ! -e "$dir/virtlogd.pid" ] || die "$dir is already up"
    mkdir -p "$dir"/{etc/hooks/qemu.d,etc/qemu,run,lib,log,cache}
    cat >"$dir/etc/libvirtd.conf" <<EOF
log_outputs = "3:file:/var/log/libvirt/libvirtd.log"
unix_sock_rw_perms = "0700"
auth_unix_rw = "none"
EOF
    # A second sandbox as a second "host" (migration tests): libvirt refuses to migrate
    # between two daemons with the same host UUID.
    if [ -n "${HUGEPREP_SANDBOX_HOST_UUID:-}" ]; then
        echo "host_uuid = \"$HUGEPREP_SANDBOX_HOST_UUID\"" >>"$dir/etc/libvirtd.conf"
    fi
    cat >"$dir/etc/virtlogd.conf" <<EOF
log_outputs = "3:file:/var/log/libvirt/virtlogd.log"
EOF
    # The package's qemu.conf as shipped, then only what docs/libvirt.md tells operators to
    # add (qemu.conf.snippet): QEMU runs as the distribution's user with dynamic ownership
    # and its private /dev, as on a real host.
    cp /etc/libvirt/qemu.conf "$dir/etc/qemu.conf"
    cat >>"$dir/etc/qemu.conf" <<EOF

# hugeprep's sandbox.sh: qemu.conf.snippet
hugetlbfs_mount = "$mount"
memory_backing_dir = "$backing"
EOF
    if [ -n "${HUGEPREP_SANDBOX_QEMU_USER:-}" ]; then
        cat >>"$dir/etc/qemu.conf" <<EOF
user = "$HUGEPREP_SANDBOX_QEMU_USER"
group = "${HUGEPREP_SANDBOX_QEMU_GROUP:-$HUGEPREP_SANDBOX_QEMU_USER}"
EOF
    fi
    if [ -n "$hook" ]; then
        printf '#!/bin/sh\nexec %s "$@"\n' "$hook" >"$dir/etc/hooks/qemu.d/hugeprep"
        chmod 0755 "$dir/etc/hooks/qemu.d/hugeprep"
    fi
    # What udev does on a real host; the group and mode only widen access for kvm's members,
    # so they stay after `down` (other users of /dev/kvm are not disturbed).
    if [ -c /dev/kvm ] && getent group kvm >/dev/null; then
        if [ "$(stat -c %G /dev/kvm)" != kvm ] || [ $((0$(stat -c %a /dev/kvm) & 060)) -ne $((060)) ]; then
            chgrp kvm /dev/kvm
            chmod g+rw /dev/kvm
        fi
    fi
    # Mount points the host lacks (/run/libvirt when libvirt never ran): made now, removed by
    # `down`, so the host is left as it was.
    for p in /etc/libvirt /run/libvirt /var/lib/libvirt /var/log/libvirt /var/cache/libvirt; do
        [ -d "$p" ] || { mkdir -p "$p"; echo "$p" >>"$dir/created-dirs"; }
    done
    # virtlogd creates the namespace and keeps it alive; libvirtd joins it.
    unshare --mount --propagation private -- sh -c '
        set -e
        d=$1
        mount --bind "$d/etc" /etc/libvirt
        for p in run:/run/libvirt lib:/var/lib/libvirt log:/var/log/libvirt cache:/var/cache/libvirt; do
            mount --bind "$d/${p%%:*}" "${p#*:}"
        done
        exec virtlogd -d -p "$d/virtlogd.pid" -f /etc/libvirt/virtlogd.conf
    ' sh "$dir"
    for i in $(seq 100); do
        [ -s "$dir/virtlogd.pid" ] && break
        sleep 0.05
    done
    start_libvirtd
    ;;
restart-libvirtd)
    stop_pidfile "$dir/libvirtd.pid"
    start_libvirtd
    ;;
stop-libvirtd)
    stop_pidfile "$dir/libvirtd.pid"
    ;;
start-libvirtd)
    start_libvirtd
    ;;
down)
    [ -d "$dir" ] || exit 0
    if [ -S "$dir/run/libvirt-sock" ] && [ -f "$dir/libvirtd.pid" ]; then
        for d in $(virsh_ list --uuid 2>/dev/null); do
            virsh_ destroy "$d" >/dev/null 2>&1 || true
        done
        for d in $(virsh_ list --all --uuid 2>/dev/null); do
            virsh_ undefine "$d" >/dev/null 2>&1 || true
        done
    fi
    # libvirtd, virtlogd and any QEMU that outlived libvirtd (stopped while a domain ran).
    stop_pidfile "$dir/libvirtd.pid" "$dir/virtlogd.pid" "$dir"/run/qemu/*.pid
    if [ -f "$dir/created-dirs" ]; then
        while read -r p; do rmdir "$p" 2>/dev/null || true; done <"$dir/created-dirs"
    fi
    rm -rf "$dir"
    ;;
*) die "unknown command $cmd (up, restart-libvirtd, stop-libvirtd, start-libvirtd, down)" ;;
esac
