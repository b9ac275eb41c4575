//! `hugeprep libvirt-hook` against a real libvirtd, virtlogd and QEMU/KVM (started and
//! stopped by the harness, in their own mount namespace): domains take their memory from
//! the warm pool at `virsh start` and give it back, scrubbed, when they stop. QEMU runs as
//! the distribution configures it (`libvirt-qemu`, dynamic ownership, its private /dev).

mod daemon_util;
mod libvirt_util;

use std::os::unix::fs::MetadataExt;

use daemon_util::{Env, MIB};
use libvirt_util::{domain_xml, file_is_zero, inode, tools_present, Lab};

/// Writes `pattern` at `offset` of a lease through hugeprep's own link.
#[test]
fn lessee_entry() {
    daemon_util::lessee::entry();
}

/// Writes into a running guest's memory through its lease, from a process that exits (the
/// test process itself never opens a lease: it would keep the release from being proven).
fn write_at(lease: &hugeprep::pool::LeaseInfo, offset: usize, pattern: &[u8]) {
    let text = std::str::from_utf8(pattern).unwrap();
    daemon_util::lessee::write_at(&lease.path, lease.size, offset, text);
}

/// A running domain maps exactly the hook's lease files (one per backend), took no pages of
/// its own, and its guest-physical memory at `gpa` is the lease's memory.
fn check_running(lab: &Lab, uuid: &str, aliases: &[&str], free_idle: u64) {
    let leases = lab.leases_of(uuid);
    assert_eq!(leases.len(), aliases.len(), "{leases:?}");
    let maps = lab.qemu_backing_maps(uuid);
    let expected: Vec<(String, u64)> = aliases
        .iter()
        .zip(&leases)
        .map(|(a, l)| {
            assert!(l.name.ends_with(a), "{} for {a}", l.name);
            (a.to_string(), inode(&l.path))
        })
        .collect();
    assert_eq!(maps, expected, "QEMU maps other files than the leases");
    lab.assert_qemu_owns(uuid, lab.qemu_uid);
    // Once the refill settles the pool is at its target again: the pages in use are the
    // warm pool plus the leases, so QEMU took none of its own.
    let leased: u64 = leases.iter().map(|l| l.size).sum();
    let p = lab.daemon.settle(lab.warm);
    assert_eq!(p.kinds[0].leased_bytes, leased);
    assert_eq!(lab.env.mount_used(), lab.warm + leased);
    assert_eq!(lab.env.free_pages(), free_idle - leased / (2 * MIB));
}

#[test]
fn domains_start_on_leases_and_give_them_back() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new("libvirt-start", 256 * MIB, 128 * MIB);
    assert_ne!(lab.qemu_uid, 0, "the package runs QEMU unprivileged");
    let free_idle = lab.env.free_pages();

    // One backend: pc.ram. The guest sees what is written into hugeprep's lease, and after
    // destroy the scrub has removed it.
    let uuid = lab.uuid();
    lab.start(&domain_xml("one-cell", &uuid, 0, true, ""));
    check_running(&lab, &uuid, &["pc.ram"], free_idle);
    let lease = &lab.leases_of(&uuid)[0];
    assert_eq!(lease.size, 32 * MIB);
    write_at(lease, 16 << 20, b"hugeprep-was-here");
    assert_eq!(lab.guest_bytes(&uuid, 16 << 20, 17), b"hugeprep-was-here");
    lab.destroy(&uuid);
    lab.assert_clean();

    // Two cells bound to host node 0 (numatune for cell 0, hugeprep metadata for cell 1):
    // one lease per cell, from node 0, and QEMU binds each mapping to node 0.
    let uuid = lab.uuid();
    let extra = "<numatune><memnode cellid='0' mode='strict' nodeset='0'/></numatune>
      <metadata><hp:memory xmlns:hp='urn:hugeprep:libvirt:1' page_size='2M'>
        <hp:cell id='1' node='0'/></hp:memory></metadata>";
    lab.start(&domain_xml("two-cells", &uuid, 2, true, extra));
    check_running(&lab, &uuid, &["ram-node0", "ram-node1"], free_idle);
    let leases = lab.leases_of(&uuid);
    assert!(leases.iter().all(|l| l.node == 0 && l.size == 32 * MIB));
    let numa = lab.qemu_numa_map(&uuid, "ram-node0");
    assert!(
        numa.contains("bind:0"),
        "cell 0 not bound to node 0: {numa}"
    );
    // Cell 1 starts at guest-physical 32 MiB.
    write_at(&leases[1], MIB as usize, b"cell-one");
    assert_eq!(lab.guest_bytes(&uuid, 33 * MIB, 8), b"cell-one");
    lab.destroy(&uuid);
    lab.assert_clean();

    // A domain that does not opt in (anonymous memory) starts untouched.
    let uuid = lab.uuid();
    lab.start(&domain_xml("plain", &uuid, 0, false, ""));
    assert!(lab.leases_of(&uuid).is_empty());
    assert!(lab.qemu_backing_maps(&uuid).is_empty());
    lab.destroy(&uuid);
    lab.assert_clean();

    // Spaces, quotes and non-ASCII in the name; two running domains whose names share their
    // first 20 characters (libvirt's directories differ only by the start's id).
    let odd = "ünï 'q' \"x\" long-name & more";
    let twin_a = "same-twenty-chars-pre-A";
    let twin_b = "same-twenty-chars-pre-B";
    let uuids: Vec<String> = (0..3).map(|_| lab.uuid()).collect();
    for (name, uuid) in [odd, twin_a, twin_b].iter().zip(&uuids) {
        lab.start(&domain_xml(name, uuid, 0, true, ""));
    }
    for (name, uuid) in [odd, twin_a, twin_b].iter().zip(&uuids) {
        let leases = lab.leases_of(uuid);
        assert_eq!(leases.len(), 1, "{name}");
        assert_eq!(
            lab.qemu_backing_maps(uuid),
            vec![("pc.ram".to_string(), inode(&leases[0].path))],
            "{name}"
        );
    }
    for uuid in &uuids {
        lab.destroy(uuid);
    }
    lab.assert_clean();

    // libvirtd restarts while a domain runs: the leases stay, and go when it stops.
    let uuid = lab.uuid();
    lab.start(&domain_xml("survivor", &uuid, 2, true, ""));
    let before = lab.leases_of(&uuid);
    lab.sandbox.restart_libvirtd().unwrap();
    assert_eq!(lab.leases_of(&uuid), before);
    assert_eq!(
        lab.sandbox.virsh_ok(&["domstate", &uuid]).unwrap().trim(),
        "paused"
    );
    check_running(&lab, &uuid, &["ram-node0", "ram-node1"], free_idle);
    // So does a restart of hugeprep's daemon: the release finds the leases by UUID.
    lab.daemon.stop();
    lab.respawn_daemon();
    assert_eq!(lab.leases_of(&uuid), before);
    lab.destroy(&uuid);
    lab.assert_clean();

    // Start, destroy, start again: nothing accumulates.
    let uuid = lab.uuid();
    for _ in 0..20 {
        lab.start(&domain_xml("again", &uuid, 0, true, ""));
        assert_eq!(lab.leases_of(&uuid).len(), 1);
        lab.destroy(&uuid);
        assert!(lab.leases_of(&uuid).is_empty());
    }
    lab.assert_clean();
    assert_eq!(lab.env.free_pages(), free_idle);
}

/// One line on stderr, nothing on stdout.
fn one_line(out: &std::process::Output) -> String {
    assert!(out.stdout.is_empty(), "hook wrote on stdout");
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

#[test]
fn shortage_daemon_down_bad_input_and_stale_leases_leak_nothing() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new("libvirt-fail", 256 * MIB, 128 * MIB);
    let huge = |uuid: &str| {
        domain_xml("huge", uuid, 0, true, "").replace(
            "<memory unit='MiB'>32</memory>",
            "<memory unit='GiB'>4096</memory>",
        )
    };

    // The pool cannot serve: the start fails with the hook's line saying what is short.
    let uuid = lab.uuid();
    let out = lab.create(&huge(&uuid));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pool cannot serve pc.ram") && err.contains("available"),
        "{err}"
    );
    lab.assert_clean();
    // ... or, configured so, the hook steps aside and QEMU allocates on its own.
    lab.configure(|c| c.on_shortage = hugeprep::vmm::libvirt::Fallback::Cold);
    let xml = huge(&uuid).replace("<domain type='kvm'>", "<domain type='kvm' id='90'>");
    let out = lab.run_hook("huge", "start", "begin", &xml);
    assert!(out.status.success());
    assert!(one_line(&out).contains("starting cold"));
    lab.assert_clean();

    // hugeprep's metadata reaches the hook through libvirt: a page size that the mount of
    // memory_backing_dir does not have refuses the start.
    let uuid = lab.uuid();
    let meta = "<metadata><hp:memory xmlns:hp='urn:hugeprep:libvirt:1' page_size='1G'/></metadata>";
    let out = lab.create(&domain_xml("one-gig", &uuid, 0, true, meta));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("page_size 1G"), "{err}");
    lab.assert_clean();

    // Malformed XML fails with the parser's position; operations the hook does not act on
    // pass whatever stdin holds.
    let out = lab.run_hook("bad", "start", "begin", "<domain><name>bad</name");
    assert!(!out.status.success());
    assert!(one_line(&out).contains("malformed"));
    assert!(lab
        .run_hook("bad", "started", "begin", "garbage")
        .status
        .success());
    lab.assert_clean();

    // A per-domain directory that is not QEMU's (planted by another user who can write
    // libvirt's directory and guess the next domain id) is refused, naming it; no link lands
    // in it and no lease is left. (A planted symbolic link cannot exist here: this kernel
    // refuses symlinks on hugetlbfs with EINVAL; `hugetlb::dir`'s unit test covers the link
    // on tmpfs.)
    let qemu_dir = lab.backing.join("libvirt/qemu");
    std::fs::create_dir_all(&qemu_dir).unwrap();
    let outside = lab.env.dir.join("planted-target");
    std::fs::create_dir_all(&outside).unwrap();
    let planted = qemu_dir.join("91-planted");
    std::fs::create_dir(&planted).unwrap();
    std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
    let mut cases = vec![(91, "planted", planted.clone())];
    let linked = qemu_dir.join("92-linked");
    match std::os::unix::fs::symlink(&outside, &linked) {
        Ok(()) => cases.push((92, "linked", linked.clone())),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}"),
    }
    for (id, name, dir) in &cases {
        let uuid = lab.uuid();
        let xml = domain_xml(name, &uuid, 0, true, "").replace(
            "<domain type='kvm'>",
            &format!("<domain type='kvm' id='{id}'>"),
        );
        let out = lab.run_hook(name, "start", "begin", &xml);
        assert!(!out.status.success(), "{out:?}");
        let err = one_line(&out);
        assert!(
            err.contains(&dir.display().to_string()) && err.contains("refusing"),
            "{err}"
        );
        assert!(lab.leases_of(&uuid).is_empty(), "lease kept");
    }
    assert!(
        Env::names(&planted).is_empty(),
        "a link landed in the planted directory"
    );
    assert!(
        Env::names(&outside).is_empty(),
        "a link landed behind the planted link"
    );
    std::fs::remove_dir(&planted).unwrap();
    let _ = std::fs::remove_file(&linked);
    lab.assert_clean();

    // A lease whose domain is gone (never linked by libvirt) is released by the next hook
    // call; a lease left from an earlier start of the same domain is replaced.
    let gone = lab.uuid();
    let again = lab.uuid();
    for uuid in [&gone, &again] {
        lab.daemon
            .lease(
                &hugeprep::vmm::libvirt::lease_name(uuid, "pc.ram"),
                32 * MIB,
            )
            .unwrap();
    }
    lab.start(&domain_xml("again", &again, 0, true, ""));
    assert!(lab.leases_of(&gone).is_empty(), "stale lease kept");
    let leases = lab.leases_of(&again);
    assert_eq!(lab.qemu_backing_maps(&again)[0].1, inode(&leases[0].path));
    lab.destroy(&again);
    lab.assert_clean();
    // ... and by `--reconcile`, for a timer.
    lab.daemon
        .lease(
            &hugeprep::vmm::libvirt::lease_name(&gone, "pc.ram"),
            32 * MIB,
        )
        .unwrap();
    lab.reconcile();
    lab.assert_clean();

    // QEMU dies while libvirtd is down: libvirtd finds it gone when it comes back and the
    // release hook gives the leases back.
    let uuid = lab.uuid();
    lab.start(&domain_xml("orphan", &uuid, 0, true, ""));
    let qemu = lab.sandbox.qemu_pid(&uuid).unwrap();
    lab.sandbox.stop_libvirtd().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(qemu as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    lab.sandbox.start_libvirtd().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !lab.leases_of(&uuid).is_empty() {
        assert!(std::time::Instant::now() < deadline, "orphan's leases kept");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    lab.assert_clean();

    // The daemon is down: after retrying for daemon_retry_s the start fails with the hook's
    // line ...
    lab.configure(|c| c.daemon_retry_s = 1);
    lab.daemon.stop();
    let uuid = lab.uuid();
    let out = lab.create(&domain_xml("nodaemon", &uuid, 0, true, ""));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hugeprep daemon unavailable") && err.contains("retried for 1 s"),
        "{err}"
    );
    // ... or, configured so, QEMU starts cold on a file of its own.
    lab.configure(|c| c.on_daemon_down = hugeprep::vmm::libvirt::Fallback::Cold);
    lab.start(&domain_xml("nodaemon", &uuid, 0, true, ""));
    let maps = lab.qemu_backing_maps(&uuid);
    assert_eq!(maps.len(), 1);
    assert_eq!(maps[0].0, "pc.ram");
    lab.destroy(&uuid);
    lab.respawn_daemon();
    lab.assert_clean();
}

/// `domain_xml`'s file-backed `<memoryBacking>` with `extra` added inside it.
fn with_backing(xml: &str, extra: &str) -> String {
    let end = "<access mode='shared'/></memoryBacking>";
    assert!(xml.contains(end));
    xml.replace(
        end,
        &format!("<access mode='shared'/>{extra}</memoryBacking>"),
    )
}

#[test]
fn leases_come_back_scrubbed_and_discard_domains_leave_the_pool_whole() {
    if !tools_present() {
        return;
    }
    // Room in the mount for the warm pool and one lease only.
    let mut lab = Lab::new("libvirt-discard", 160 * MIB, 128 * MIB);
    let free_idle = lab.env.free_pages();

    // The pool is short and the mount full while a domain runs (another lease holds the
    // room), so the domain's lease cannot be replaced: the kernel's free hugepages do not
    // move at the start, and at the release the file itself is scrubbed back into the pool.
    let other = lab.daemon.lease("other", 32 * MIB).unwrap();
    lab.daemon.settle(lab.warm);
    let free_before = lab.env.free_pages();
    let uuid = lab.uuid();
    lab.start(&domain_xml("scrubbed", &uuid, 0, true, ""));
    let lease = lab.leases_of(&uuid).remove(0);
    assert_eq!(
        lab.qemu_backing_maps(&uuid),
        vec![("pc.ram".to_string(), inode(&lease.path))]
    );
    assert_eq!(lab.env.free_pages(), free_before, "QEMU took hugepages");
    write_at(&lease, 4 << 20, b"scrub-me");
    assert_eq!(lab.guest_bytes(&uuid, 4 << 20, 8), b"scrub-me");
    let ino = inode(&lease.path);
    lab.destroy(&uuid);
    lab.daemon.settle(lab.warm);
    let kept: Vec<String> = Env::names(&lab.env.pool_dir())
        .into_iter()
        .filter(|n| inode(&lab.env.pool_dir().join(n)) == ino)
        .collect();
    assert_eq!(kept.len(), 1, "the released file is not back in the pool");
    assert!(file_is_zero(&lab.env.pool_dir().join(&kept[0])));
    lab.daemon.release(other.id).unwrap();
    lab.assert_clean();
    assert_eq!(lab.env.free_pages(), free_idle);

    // OpenStack Nova's file-backed memory (`<discard/>`), and the same with libvirt's own
    // preallocation, which over a pre-faulted lease touches pages already there.
    for (name, extra, prealloc) in [
        ("discard", "<discard/>", false),
        (
            "discard-immediate",
            "<discard/><allocation mode='immediate'/>",
            true,
        ),
    ] {
        let uuid = lab.uuid();
        lab.start(&with_backing(&domain_xml(name, &uuid, 0, true, ""), extra));
        // QEMU maps the lease and took no pages of its own, preallocating or not.
        check_running(&lab, &uuid, &["pc.ram"], free_idle);
        let backends = lab.qemu_memory_backends(&uuid);
        assert_eq!(backends.len(), 1, "{name}: {backends:?}");
        let b = &backends[0];
        assert_eq!(b["qom-type"], "memory-backend-file", "{name}: {b}");
        assert_eq!(
            b["discard-data"], true,
            "{name}: libvirt passed no discard-data: {b}"
        );
        assert_eq!(
            b["prealloc"].as_bool().unwrap_or(false),
            prealloc,
            "{name}: {b}"
        );
        let lease = lab.leases_of(&uuid).remove(0);
        write_at(&lease, 8 << 20, b"discard-me");
        assert_eq!(lab.guest_bytes(&uuid, 8 << 20, 10), b"discard-me", "{name}");

        // QEMU punches every page out of the lease when it stops: held open here, the
        // file has no blocks left and its pages are back in the kernel's free pool.
        let held = std::fs::File::open(&lease.path).unwrap();
        assert_eq!(
            held.metadata().unwrap().blocks() * 512,
            lease.size,
            "{name}"
        );
        lab.destroy(&uuid);
        assert_eq!(
            held.metadata().unwrap().blocks(),
            0,
            "{name}: QEMU left pages"
        );
        assert_eq!(lab.env.free_pages(), free_idle, "{name}");
        drop(held);

        // The lease is released, the pool whole and settled at its target, nothing leaked.
        // The pool refilled to its target while the domain ran, so the released file (with
        // no pages left) is given back rather than refilled: tests/pool_holes.rs refills
        // the holes of a file QEMU punched when the pool is short.
        lab.assert_clean();
        assert_eq!(lab.env.free_pages(), free_idle, "{name}");
    }
}
