// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0 OR BSD-3-Clause
//
// The kernel side of hugeprep's release proof (src/sys/reach_bpf.rs, docs/security.md).
//
// A task_file iterator, run over one thread of the daemon: for the daemon's descriptor of a
// released pool file (the descriptor that thread names in `targets`), it reads in the
// kernel the counts that say whether anyone but the daemon can still reach the file, and
// writes one `struct report`:
//
// - its dentries and their references: every open file (O_PATH ones, and those in flight
//   in a unix socket, included) and every mount of the file holds one;
// - the mounts of its file system that show less than the whole (a bind mount of a
//   directory or of the file), in any mount namespace or none;
// - the reference count of every folio in its page cache: the page cache holds one per
//   page, and a mapping, a pin (io_uring, VFIO, RDMA), a pipe buffer (vmsplice) or any
//   other holder adds to it. The kernel frees a hugetlb folio only when that count drops
//   to zero: a folio at the page cache's count alone is one nobody else holds.
//
// The cost is bounded by the daemon's descriptors and the file's pages, not by the host.
// Types are declared here with only the fields read, and relocated against the running
// kernel's BTF (CO-RE): no vmlinux.h is generated at build time.

#include <linux/types.h>
#include <linux/bpf.h>

typedef __u32 u32;
typedef __u64 u64;
typedef _Bool bool;

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)
typedef struct {
	int counter;
} atomic_t;
struct hlist_node {
	struct hlist_node *next;
};
struct hlist_head {
	struct hlist_node *first;
};
struct lockref {
	int count;
};
struct task_struct {
	int pid;
};
struct xarray {
	void *xa_head;
};
struct xa_node {
	unsigned char shift;
	void *slots[64];
};
struct address_space {
	struct xarray i_pages;
};
struct super_block {
	unsigned int s_dev;
	struct dentry *s_root;
	struct mount *s_mounts;
};
struct inode {
	unsigned long i_ino;
	unsigned int __i_nlink;
	struct super_block *i_sb;
	struct address_space *i_mapping;
	struct hlist_head i_dentry;
};
struct dentry {
	struct lockref d_lockref;
	union {
		struct hlist_node d_alias;
	} d_u;
};
struct vfsmount {
	struct dentry *mnt_root;
};
struct mount {
	struct vfsmount mnt;
	struct mount *mnt_next_for_sb;
};
struct path {
	struct dentry *dentry;
};
struct file {
	struct path f_path;
	struct inode *f_inode;
};
struct folio {
	unsigned long index;
	atomic_t _refcount;
	unsigned long _flags_1;
	atomic_t _entire_mapcount;
	atomic_t _pincount;
	unsigned int _nr_pages;
};
struct seq_file;
struct bpf_iter_meta {
	struct seq_file *seq;
};
struct bpf_iter__task_file {
	struct bpf_iter_meta *meta;
	struct task_struct *task;
	__u32 fd;
	struct file *file;
};
#pragma clang attribute pop

char LICENSE[] SEC("license") = "GPL";

// Bits of a target's flags.
#define PROBE_FOLIOS 1u

#define MAX_ALIASES 16
#define MAX_MOUNTS 4096
#define STACK_MAX 512
#define MAX_NODES (1u << 22)

// Pinned folios whose index a report gives (`pinned_at`).
#define PINNED_AT 16

// Read by src/sys/reach_bpf.rs field by field: keep the two in step (`version`).
struct report {
	__u32 version;
	__u32 dev;
	__u64 ino;
	__u32 nlink;
	__s32 dentry_count;
	__u32 other_aliases;
	__u32 aliases_truncated;
	__u32 mounts;
	__u32 partial_mounts;
	__u32 file_mounts;
	__u32 mounts_truncated;
	__u32 walked;
	__u32 incomplete;
	__u64 folios;
	__u64 pages;
	__u64 held_folios;
	__s64 first_held_refcount;
	__s64 first_held_pincount;
	__s64 first_held_mapcount;
	__u64 odd_entries;
	__u64 nodes;
	// The run this report answers (the target's `run`), and whether another run used the
	// same scratch meanwhile (then the caller fails closed).
	__u64 run;
	__u32 interleaved;
	__u32 pad;
	// Held folios whose references a mapping does not explain (a pin, a pipe buffer, any
	// get_page): a truncate leaves them with their holder (version 3).
	__u64 pinned_folios;
	// The page-cache index (in base pages) of the first PINNED_AT of them.
	__u64 pinned_at[PINNED_AT];
};

// Scratch space of one walk. It is never per-CPU memory: the iterator runs with migration
// disabled but preemptible, and the daemon's threads that prove (an API thread at
// SCHED_FIFO, the worker at SCHED_IDLE) can preempt each other on one CPU in the middle of a
// walk. Each run owns a slot of `walks` that its caller took for it alone and names in its
// target, so no run ever shares its scratch with another.
struct walk {
	// The daemon's dentry of the file, its file system's root, a list's next entry.
	unsigned long dentry;
	unsigned long root;
	unsigned long cursor;
	__u64 sp;
	// Runs inside this slot now (more than one: interleaved, the report says so).
	__u32 busy;
	__u32 pad;
	__u64 stack[STACK_MAX];
	void *slots[64];
	struct report r;
};

#define WALK_SLOTS 64

// Read by src/sys/reach_bpf.rs (it writes every field).
struct target {
	__u32 fd;
	__u32 flags;
	// A number the caller chose for this run: the report carries it back.
	__u64 run;
	// The slot of `walks` the caller took for this run.
	__u32 slot;
	__u32 pad;
};

// The descriptor each daemon thread asks about, by thread id.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct target);
} targets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, WALK_SLOTS);
	__type(key, __u32);
	__type(value, struct walk);
} walks SEC(".maps");

// xarray internal entries (include/linux/xarray.h).
static __always_inline bool xa_is_internal(unsigned long e)
{
	return (e & 3) == 2;
}
static __always_inline bool xa_is_node(unsigned long e)
{
	return xa_is_internal(e) && e > 4096;
}
static __always_inline bool xa_is_sibling(unsigned long e)
{
	return xa_is_internal(e) && e < ((63ul << 2) | 2);
}

static __always_inline void check_folio(struct walk *w, unsigned long entry)
{
	struct folio *f = (struct folio *)entry;
	__s64 refs = BPF_CORE_READ(f, _refcount.counter);
	__s64 pins = BPF_CORE_READ(f, _pincount.counter);
	__s64 maps = BPF_CORE_READ(f, _entire_mapcount.counter);
	__u64 nr;
	if (bpf_core_field_exists(f->_nr_pages))
		nr = BPF_CORE_READ(f, _nr_pages);
	else
		nr = 1ull << (BPF_CORE_READ(f, _flags_1) & 0xff);
	w->r.folios++;
	w->r.pages += nr;
	// The page cache holds one reference per page of a folio; a mapping, a pin, a pipe
	// buffer or any other holder adds to it.
	if (refs != (__s64)nr || pins != 0 || maps != -1) {
		if (w->r.held_folios == 0) {
			w->r.first_held_refcount = refs;
			w->r.first_held_pincount = pins;
			w->r.first_held_mapcount = maps;
		}
		w->r.held_folios++;
		// A mapping of a hugetlb folio holds one reference and one mapcount
		// (`_entire_mapcount` starts at -1); what is beyond is held elsewhere.
		if (pins != 0 || refs > (__s64)nr + maps + 1) {
			if (w->r.pinned_folios < PINNED_AT)
				w->r.pinned_at[w->r.pinned_folios & (PINNED_AT - 1)] =
					BPF_CORE_READ(f, index);
			w->r.pinned_folios++;
		}
	}
}

// bpf_loop's context lives on the stack: it points at the walk.
struct loop {
	struct walk *w;
};

// One node of the page cache's xarray: its 64 slots, children pushed.
static long walk_node(__u64 i, void *ctx)
{
	struct walk *w = ((struct loop *)ctx)->w;
	if (w->sp == 0)
		return 1;
	w->sp--;
	struct xa_node *node = (struct xa_node *)w->stack[w->sp & (STACK_MAX - 1)];
	w->r.nodes++;
	if (bpf_probe_read_kernel(w->slots, sizeof(w->slots),
				  __builtin_preserve_access_index(&node->slots)) != 0) {
		w->r.incomplete = 1;
		return 1;
	}
	for (int j = 0; j < 64; j++) {
		unsigned long e = (unsigned long)w->slots[j];
		if (e == 0 || xa_is_sibling(e))
			continue;
		if (xa_is_node(e)) {
			if (w->sp >= STACK_MAX) {
				w->r.incomplete = 1;
				return 1;
			}
			w->stack[w->sp & (STACK_MAX - 1)] = e - 2;
			w->sp++;
			continue;
		}
		if (xa_is_internal(e) || (e & 1)) {
			// A retry or zero entry (a change under way), or a value entry: nothing a
			// hugetlbfs page cache holds at rest.
			w->r.odd_entries++;
			continue;
		}
		check_folio(w, e);
	}
	return 0;
}


static long next_alias(__u64 i, void *ctx)
{
	struct walk *w = ((struct loop *)ctx)->w;
	if (!w->cursor)
		return 1;
	struct hlist_node *node = (struct hlist_node *)w->cursor;
	unsigned long off = bpf_core_field_offset(struct dentry, d_u.d_alias);
	if ((unsigned long)node - off != w->dentry)
		w->r.other_aliases++;
	w->cursor = (unsigned long)BPF_CORE_READ(node, next);
	return 0;
}

static long next_mount(__u64 i, void *ctx)
{
	struct walk *w = ((struct loop *)ctx)->w;
	if (!w->cursor)
		return 1;
	struct mount *m = (struct mount *)w->cursor;
	unsigned long root = (unsigned long)BPF_CORE_READ(m, mnt.mnt_root);
	w->r.mounts++;
	if (root != w->root)
		w->r.partial_mounts++;
	if (root == w->dentry)
		w->r.file_mounts++;
	w->cursor = (unsigned long)BPF_CORE_READ(m, mnt_next_for_sb);
	return 0;
}

static __always_inline void walk_folios(struct walk *w, struct inode *inode)
{
	unsigned long head = (unsigned long)BPF_CORE_READ(inode, i_mapping, i_pages.xa_head);
	w->sp = 0;
	if (head == 0)
		return;
	if (!xa_is_node(head)) {
		if (xa_is_internal(head) || (head & 1))
			w->r.odd_entries++;
		else
			check_folio(w, head);
		return;
	}
	w->stack[0] = head - 2;
	w->sp = 1;
	struct loop l = { .w = w };
	long n = bpf_loop(MAX_NODES, walk_node, &l, 0);
	if (n < 0 || w->sp != 0)
		w->r.incomplete = 1;
}

SEC("iter/task_file")
int hugeprep_probe(struct bpf_iter__task_file *ctx)
{
	struct seq_file *seq = ctx->meta->seq;
	struct task_struct *task = ctx->task;
	struct file *file = ctx->file;
	if (!task || !file)
		return 0;
	__u32 tid = BPF_CORE_READ(task, pid);
	struct target *t = bpf_map_lookup_elem(&targets, &tid);
	if (!t || t->fd != ctx->fd)
		return 0;
	__u32 slot = t->slot;
	struct walk *w = bpf_map_lookup_elem(&walks, &slot);
	if (!w)
		return 0;
	// Any other run inside this slot from here to the report marks it interleaved (a
	// caller bug: a slot is taken for one run at a time); the caller then fails closed.
	__sync_fetch_and_add(&w->busy, 1);
	__u32 entered = *(volatile __u32 *)&w->busy;
	__builtin_memset(&w->r, 0, sizeof(w->r));
	w->r.version = 3;
	w->r.run = t->run;

	struct dentry *dentry = BPF_CORE_READ(file, f_path.dentry);
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	struct super_block *sb = BPF_CORE_READ(inode, i_sb);
	w->r.dev = BPF_CORE_READ(sb, s_dev);
	w->r.ino = BPF_CORE_READ(inode, i_ino);
	w->r.nlink = BPF_CORE_READ(inode, __i_nlink);
	w->r.dentry_count = BPF_CORE_READ(dentry, d_lockref.count);

	// Every other dentry of the inode (a name unlinked while something held it).
	w->dentry = (unsigned long)dentry;
	w->cursor = (unsigned long)BPF_CORE_READ(inode, i_dentry.first);
	struct loop l = { .w = w };
	bpf_loop(MAX_ALIASES, next_alias, &l, 0);
	if (w->cursor)
		w->r.aliases_truncated = 1;

	// Every mount of the file system, in any namespace or none (a detached tree too).
	w->root = (unsigned long)BPF_CORE_READ(sb, s_root);
	w->cursor = (unsigned long)BPF_CORE_READ(sb, s_mounts);
	bpf_loop(MAX_MOUNTS, next_mount, &l, 0);
	if (w->cursor)
		w->r.mounts_truncated = 1;

	if (t->flags & PROBE_FOLIOS) {
		w->r.walked = 1;
		walk_folios(w, inode);
	}
	if (entered != 1 || *(volatile __u32 *)&w->busy != 1)
		w->r.interleaved = 1;
	__sync_fetch_and_add(&w->busy, -1);
	bpf_seq_write(seq, &w->r, sizeof(w->r));
	return 0;
}
