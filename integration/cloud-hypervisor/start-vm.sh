#!/usr/bin/env bash
# How a control plane starts a cloud-hypervisor VM on hugeprep memory through both APIs:
#
#   1. start cloud-hypervisor with only its API socket, in a cgroup of its own: its pid is
#      known before its memory is;
#   2. lease from hugeprep with that pid (`hugeprep lease NAME SIZE --pid PID`), so the
#      daemon releases the lease itself when the VMM exits, however it exits;
#   3. `vm.create` over cloud-hypervisor's REST API with the `memory` section that
#      `hugeprep ch-args --json` prints, then `vm.boot`;
#   4. wait for the VMM to exit, remove its cgroup: the lease is released and scrubbed back
#      into the warm pool (in place only once every process that mapped it has gone with its
#      cgroup; otherwise the daemon deletes the file and refills).
#
#   integration/cloud-hypervisor/start-vm.sh NAME SIZE KERNEL
#   e.g. integration/cloud-hypervisor/start-vm.sh vm1 4G /var/lib/images/vmlinux
#
# Env: HUGEPREP (the hugeprep binary), HUGEPREP_SOCKET (the daemon's), CLOUD_HYPERVISOR
# (default: cloud-hypervisor from PATH), RUN_DIR (API socket, serial log, vm.json; default
# /run/hugeprep-ch/NAME), PAGE_SIZE (2M), CMDLINE (the guest's kernel command line), CPUS (1).
# Stop the VM from elsewhere with
#   curl --unix-socket RUN_DIR/api.sock -X PUT http://localhost/api/v1/vmm.shutdown
# Needs root (cgroups, /dev/kvm), jq and curl.
set -euo pipefail

name=${1:?usage: $0 NAME SIZE KERNEL}
size=${2:?usage: $0 NAME SIZE KERNEL}
kernel=${3:?usage: $0 NAME SIZE KERNEL}
hugeprep=${HUGEPREP:-hugeprep}
ch=${CLOUD_HYPERVISOR:-cloud-hypervisor}
run=${RUN_DIR:-/run/hugeprep-ch/$name}
mkdir -p "$run"
sock=$run/api.sock
rm -f "$sock" "$run/serial.log"

api() { # METHOD ENDPOINT [BODY-FILE]: cloud-hypervisor's REST API over its unix socket
    curl --silent --show-error --fail-with-body --unix-socket "$sock" -X "$1" \
        -H 'Content-Type: application/json' ${3:+--data-binary "@$3"} \
        "http://localhost/api/v1/$2"
}

# 1. The VMM in a fresh child of the cgroup2 hierarchy (found in mountinfo): the cgroup
# empties exactly when the VMM and every thread it started are gone.
cg_root=$(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") { if ($(i + 1) == "cgroup2") print $5; break } }' /proc/self/mountinfo | head -1)
cg=${cg_root:?no cgroup2 mount}/hugeprep-ch-$name-$$
mkdir "$cg"
(
    echo "$BASHPID" >"$cg/cgroup.procs"
    exec "$ch" --api-socket "path=$sock"
) &
pid=$!
cleanup() {
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 1000); do [ -S "$sock" ] && break; sleep 0.01; done
[ -S "$sock" ] || { echo "cloud-hypervisor made no API socket at $sock" >&2; exit 1; }

# 2. The lease, tied to the VMM's pid.
"$hugeprep" lease "$name" "$size" --page-size "${PAGE_SIZE:-2M}" --pid "$pid" >&2

# 3. vm.create: the control plane's own body, plus hugeprep's memory section.
"$hugeprep" ch-args --json "$name" |
    jq --arg kernel "$kernel" --arg cmdline "${CMDLINE:-}" --arg serial "$run/serial.log" \
        --argjson cpus "${CPUS:-1}" \
        '{cpus: {boot_vcpus: $cpus, max_vcpus: $cpus},
          payload: ({kernel: $kernel} + (if $cmdline == "" then {} else {cmdline: $cmdline} end)),
          serial: {mode: "File", file: $serial}, console: {mode: "Off"}} + .' >"$run/vm.json"
api PUT vm.create "$run/vm.json"
api PUT vm.boot
state=$(api GET vm.info | jq -r .state)
echo "$name: cloud-hypervisor pid $pid, state $state, API $sock, serial $run/serial.log" >&2

# 4. The VM runs until the VMM exits; the daemon releases the lease when the pid goes.
wait "$pid" || true
rmdir "$cg"
trap - EXIT
echo "$name: cloud-hypervisor exited; hugeprep releases its lease" >&2
