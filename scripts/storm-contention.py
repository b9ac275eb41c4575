#!/usr/bin/env python3
"""What a boot storm waits on: kernel lock waits and run-queue waits per storm case.

Usage (as root; docs/pool.md "VM starts first" shows a result):
  off=$(python3 -c "import time;print(time.time()-time.clock_gettime(time.CLOCK_MONOTONIC))")
  perf record -k mono -o storm.data -g -a \
      -e lock:contention_begin,lock:contention_end,sched:sched_switch,sched:sched_wakeup -- \
      hugeprep bench vm-start --concurrent 4 --sizes 512M --reps 4 --vmms qemu --storm-refill 2> storm.log
  perf script -i storm.data -F comm,pid,tid,cpu,time,event,trace,ip,sym > storm.txt
  scripts/storm-contention.py storm.txt storm.log 8 "$off"

Each storm's window runs from its first lease's start to its first release (from the
daemon's log); the third argument is the number of (VMM, case) rows per repetition (8 for
QEMU alone with --storm-refill), the fourth the realtime - monotonic clock offset.
"""
import re, sys, collections, datetime, statistics as st
perf_txt, log = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]); OFF = float(sys.argv[4])
names = {2:'warm, held back',3:'half, held back',4:'warm, refill free (gate)',5:'half, refill free (gate)',6:'warm, refill free, no gate',7:'half, refill free, no gate'}
def ts(s): return datetime.datetime.strptime(s[:26], '%Y-%m-%dT%H:%M:%S.%f').replace(tzinfo=datetime.timezone.utc).timestamp()
win = {}
for line in open(log):
    m = re.match(r'(\S+Z)\s+INFO .*leased id=\d+ name=storm-(\d+)-\d+ .*ready_ms=([\d.]+)', line)
    if m:
        t = ts(m[1]); tag = int(m[2]); s = t - float(m[3])/1e3
        w = win.setdefault(tag, [s, None]); w[0] = min(w[0], s); continue
    m = re.match(r'(\S+Z)\s+INFO .*released lease=\d+ name=storm-(\d+)-\d+', line)
    if m:
        t = ts(m[1]); tag = int(m[2])
        if tag in win and win[tag][1] is None: win[tag][1] = t
wins = sorted((s, e, tag) for tag, (s, e) in win.items() if e)
def find(t):
    for s, e, tag in wins:
        if s <= t <= e: return tag
    return None
recs = []; cur = None
for line in open(perf_txt):
    if not line.startswith('\t') and line.strip():
        m = re.match(r'\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)', line)
        if not m: cur = None; continue
        cur = dict(comm=m[1], pid=int(m[2]), tid=int(m[3]), t=float(m[5]) + OFF, ev=m[6], tr=m[7], stack=[]); recs.append(cur)
    elif cur is not None and line.strip():
        p = line.split(None, 1)
        if len(p) == 2: cur['stack'].append(p[1].strip().split('+')[0])
def who(comm):
    if comm.startswith('qemu') or comm.startswith('CPU') or comm.startswith('IO ') or comm.startswith('worker'): return 'qemu'
    if comm.startswith('hugeprep-pool') or comm.startswith('hugeprep-reach'): return 'refill'
    if comm.startswith('tokio') or comm.startswith('hugeprep'): return 'daemon'
    return 'other'
def lockclass(stack, tr):
    s = ' '.join(stack)
    if 'hugetlb_fault' in s or 'hugetlbfs_fallocate' in s:
        if 'alloc_hugetlb_folio' in s or 'dequeue' in s: return 'hugetlb_lock'
        if 'mutex' in s or 'flags=MUTEX' in tr: return 'fault mutex'
    if 'alloc_hugetlb_folio' in s: return 'hugetlb_lock'
    if 'rwsem' in s or 'mmap' in s or 'flags=WRITE' in tr or 'flags=READ' in tr: return 'mmap_lock/rwsem'
    return 'other lock'
lockw = collections.defaultdict(float); runq = collections.defaultdict(float)
begin = {}; preempted = {}; woken = {}
tid_comm = {}
for r in recs:
    tag = find(r['t'])
    ev = r['ev']
    if ev == 'lock:contention_begin':
        begin[r['tid']] = (r['t'], lockclass(r['stack'], r['tr']), r['comm'])
    elif ev == 'lock:contention_end':
        b = begin.pop(r['tid'], None)
        if b and tag is not None and 'SPIN' not in b[1]:
            lockw[(tag, who(b[2]), b[1])] += r['t'] - b[0]
    elif ev == 'sched:sched_switch':
        m = re.search(r'prev_comm=(.+?) prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.+?) next_pid=(\d+)', r['tr'])
        pc, pp, ps, nc, np_ = m[1], int(m[2]), m[3], m[4], int(m[5])
        if ps.startswith('R'): preempted[pp] = (r['t'], pc)
        for d in (preempted, woken):
            x = d.pop(np_, None)
            if x and tag is not None: runq[(tag, who(x[1]))] += r['t'] - x[0]
    elif ev == 'sched:sched_wakeup':
        m = re.search(r'comm=(.+?) pid=(\d+)', r['tr'])
        woken[int(m[2])] = (r['t'], m[1])
by = collections.defaultdict(lambda: collections.defaultdict(list))
tags = sorted(set(t for _, _, t in wins))
for tag in tags:
    k = tag % N
    if k not in names: continue
    tot = collections.defaultdict(float)
    for (t, w, c), v in lockw.items():
        if t == tag: tot['lock '+c+' ('+w+')'] += v
    for (t, w), v in runq.items():
        if t == tag: tot['run-queue ('+w+')'] += v
    for key in set(list(tot.keys())):
        by[k][key].append(tot[key]*1e3)
    by[k]['_n'].append(1)
for k in sorted(by):
    n = len(by[k]['_n'])
    print(f"\n{names[k]} ({n} storms): ms per storm, median")
    for key in sorted(by[k]):
        if key == '_n': continue
        v = by[k][key] + [0.0]*(n-len(by[k][key]))
        print(f"   {key:<40} {st.median(v):8.1f}   (max {max(v):.1f})")
