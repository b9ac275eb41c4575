#!/usr/bin/env bash
# Prepare a guest memory file with hugeprep and start QEMU on it, paused, with a QMP socket.
# QEMU maps the existing file (share=on) and reuses its pages: no preallocation at start.
#
#   integration/qemu/launch-prepared.sh SIZE [PAGE_SIZE] [NODE]
#   e.g. integration/qemu/launch-prepared.sh 8G 2M 0
#
# Needs root (or a hugetlbfs mount writable by the caller), free hugepages of PAGE_SIZE
# (`hugeprep pool --set N --page-size PAGE_SIZE`) and /dev/kvm.
set -euo pipefail

size=${1:?usage: $0 SIZE [PAGE_SIZE] [NODE]}
page=${2:-2M}
node=${3:-0}
hugeprep=${HUGEPREP:-hugeprep}

# A hugetlbfs of the page size: an existing one, or one mounted for this VM.
mnt=$(awk -v p="pagesize=$page" '$9 == "hugetlbfs" && index($11, p) {print $5; exit}' /proc/self/mountinfo)
if [ -z "$mnt" ]; then
    mnt=/run/hugeprep/hugepages-$page
    mkdir -p "$mnt"
    mount -t hugetlbfs -o "pagesize=$page,mode=0770" none "$mnt"
fi

file=$mnt/vm-$$
"$hugeprep" prepare --size "$size" --page-size "$page" --node "$node" --path "$file" >&2
mib=$(( $(stat -c %s "$file") >> 20 ))
sock=/run/hugeprep-vm-$$.qmp

echo "QMP socket: $sock; guest memory: $file (delete it after the VM stops)" >&2
exec qemu-system-x86_64 -S -nodefaults -nographic \
    -machine q35,accel=kvm,memory-backend=mem0 -cpu host,-arch-capabilities -m "${mib}M" \
    -object "memory-backend-file,id=mem0,size=${mib}M,mem-path=$file,share=on,prealloc=off,host-nodes=$node,policy=bind" \
    -qmp "unix:$sock,server=on,wait=off"
