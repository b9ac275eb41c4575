//! `hugeprep libvirt-adopt` against a real libvirtd: the example domains of
//! `integration/libvirt/` written the `<hugepages>` way are rewritten into file-backed
//! shared memory (`--dry-run` first), start on the hook's leases, and `--revert` defines the
//! original again; what cannot be converted is refused with its reason and left as it was.

mod daemon_util;
mod libvirt_util;

use std::process::Output;

use daemon_util::{map_lease, succeeded as ok, Env, MIB};
use libvirt_util::{inode, tools_present, Lab};

fn adopt(lab: &Lab, extra: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .arg("libvirt-adopt")
        .args(["--connect", lab.sandbox.uri()])
        .arg("--config")
        .arg(&lab.config_path)
        .arg("--state-dir")
        .arg(&lab.env.state)
        .arg("--socket")
        .arg(&lab.env.socket)
        .args(extra)
        .output()
        .unwrap()
}

/// An example domain scaled to this test: 64 MiB, cells of 32 MiB on host node 0, a fixed
/// UUID, and `arch-capabilities` off (KVM on AMD refuses QEMU's MSR write with -cpu host).
fn example(file: &str, uuid: &str) -> String {
    let path = format!("{}/integration/libvirt/{file}", env!("CARGO_MANIFEST_DIR"));
    let xml = std::fs::read_to_string(&path).unwrap();
    let cpu_end = if xml.contains("<cpu mode='host-passthrough'/>") {
        ("<cpu mode='host-passthrough'/>", "<cpu mode='host-passthrough'><feature policy='disable' name='arch-capabilities'/></cpu>")
    } else {
        (
            "<cpu mode='host-passthrough'>",
            "<cpu mode='host-passthrough'><feature policy='disable' name='arch-capabilities'/>",
        )
    };
    xml.replace("</name>", &format!("</name>\n  <uuid>{uuid}</uuid>"))
        .replace(
            "<memory unit='GiB'>4</memory>",
            "<memory unit='MiB'>64</memory>",
        )
        .replace(
            "<memory unit='GiB'>8</memory>",
            "<memory unit='MiB'>64</memory>",
        )
        .replace("memory='4' unit='GiB'", "memory='32' unit='MiB'")
        .replace("nodeset='1'", "nodeset='0'")
        .replace("<vcpu>4</vcpu>", "<vcpu>2</vcpu>")
        .replace("cpus='0-1'", "cpus='0'")
        .replace("cpus='2-3'", "cpus='1'")
        .replace(cpu_end.0, cpu_end.1)
        .replace(
            "</emulator>",
            "</emulator>\n    <video><model type='none'/></video>\n    <memballoon model='none'/>",
        )
}

fn define(lab: &Lab, xml: &str) {
    let file = lab.env.dir.join("define.xml");
    std::fs::write(&file, xml).unwrap();
    lab.sandbox
        .virsh_ok(&["define", file.to_str().unwrap()])
        .unwrap();
}

fn dumpxml(lab: &Lab, name: &str) -> String {
    lab.sandbox
        .virsh_ok(&["dumpxml", "--inactive", "--security-info", name])
        .unwrap()
}

#[test]
fn example_hugepage_domains_are_adopted_start_on_leases_and_revert() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new("libvirt-adopt", 256 * MIB, 128 * MIB);
    for (file, name, aliases) in [
        ("domain-1cell-hugepages.xml", "vm-1cell", vec!["pc.ram"]),
        (
            "domain-2cell-hugepages.xml",
            "vm-2cell",
            vec!["ram-node0", "ram-node1"],
        ),
    ] {
        let uuid = lab.uuid();
        define(&lab, &example(file, &uuid));
        let original = dumpxml(&lab, name);
        assert!(original.contains("<hugepages"), "{original}");

        // --dry-run prints the change and defines nothing.
        let diff = ok(&adopt(&lab, &["--dry-run", name]));
        assert!(diff.contains("-    <hugepages"), "{diff}");
        assert!(diff.contains("+    <source type='file'/>"), "{diff}");
        assert!(diff.contains("+    <access mode='shared'/>"), "{diff}");
        assert!(diff.contains("page_size='2M'"), "{diff}");
        assert_eq!(dumpxml(&lab, name), original);

        let said = ok(&adopt(&lab, &[name]));
        assert!(said.contains("adopted (2M pages"), "{said}");
        let adopted = dumpxml(&lab, name);
        assert!(!adopted.contains("<hugepages"), "{adopted}");
        assert!(adopted.contains("<source type='file'/>"), "{adopted}");
        assert!(adopted.contains("<access mode='shared'/>"), "{adopted}");
        let parsed = hugeprep::vmm::libvirt::Domain::parse(&adopted).unwrap();
        assert_eq!(
            parsed.metadata.and_then(|m| m.page_size),
            Some(hugeprep::PageSize::Size2M),
            "{adopted}"
        );
        if name == "vm-2cell" {
            assert!(
                adopted.contains("<memnode cellid='1' mode='strict' nodeset='0'/>"),
                "numatune lost: {adopted}"
            );
        }
        assert!(lab
            .env
            .state
            .join(format!("libvirt-adopt/{uuid}.xml"))
            .exists());
        // Adopting again changes nothing.
        let again = ok(&adopt(&lab, &[name]));
        assert!(again.contains("nothing to change"), "{again}");
        // The same as JSON: one object per domain.
        let json: serde_json::Value =
            serde_json::from_str(&ok(&adopt(&lab, &["--json", name]))).unwrap();
        assert_eq!(json["action"], "adopt", "{json:#}");
        assert_eq!(json["domains"][0]["domain"], name, "{json:#}");
        assert_eq!(json["domains"][0]["ok"], true, "{json:#}");
        assert!(
            json["domains"][0]["message"]
                .as_str()
                .unwrap()
                .contains("nothing to change"),
            "{json:#}"
        );

        // The adopted domain starts on the hook's leases: QEMU maps them, and the guest
        // sees what is written through hugeprep's link.
        lab.sandbox
            .virsh_ok(&["start", "--paused", name])
            .unwrap_or_else(|e| panic!("{name}: {e}\n{}", lab.sandbox.log()));
        let leases = lab.leases_of(&uuid);
        assert_eq!(leases.len(), aliases.len(), "{leases:?}");
        let expected: Vec<(String, u64)> = aliases
            .iter()
            .zip(&leases)
            .map(|(a, l)| (a.to_string(), inode(&l.path)))
            .collect();
        assert_eq!(lab.qemu_backing_maps(&uuid), expected, "{name}");
        {
            let (_f, mut r) = map_lease(&leases[0]);
            r.as_mut_slice()[MIB as usize..MIB as usize + 7].copy_from_slice(b"adopted");
        }
        assert_eq!(lab.guest_bytes(&uuid, MIB, 7), b"adopted");
        lab.destroy(&uuid);
        lab.assert_clean();

        // --revert defines the original again and forgets it.
        let diff = ok(&adopt(&lab, &["--revert", "--dry-run", name]));
        assert!(diff.contains("+    <hugepages"), "{diff}");
        ok(&adopt(&lab, &["--revert", name]));
        assert_eq!(dumpxml(&lab, name), original);
        assert!(Env::names(&lab.env.state.join("libvirt-adopt")).is_empty());
        let out = adopt(&lab, &["--revert", name]);
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no original kept"),
            "{out:?}"
        );
        // As JSON: the same failure, the error in the domain's object, the same status.
        let out = adopt(&lab, &["--revert", "--json", name]);
        assert!(!out.status.success());
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["domains"][0]["ok"], false, "{json:#}");
        assert!(
            json["domains"][0]["error"]
                .as_str()
                .unwrap()
                .contains("no original kept"),
            "{json:#}"
        );
        lab.sandbox.virsh_ok(&["undefine", name]).unwrap();
    }
    refusals(&mut lab);
    lab.assert_clean();
}

/// What cannot be converted stays as it was, with the reason on stderr.
fn refusals(lab: &mut Lab) {
    let refused = |lab: &Lab, name: &str, why: &str| {
        let before = dumpxml(lab, name);
        let out = adopt(lab, &[name]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} adopted");
        assert!(err.contains(why), "{name}: {err}");
        assert_eq!(dumpxml(lab, name), before, "{name} changed");
    };

    // KubeVirt's way: hugepages from a memfd.
    let uuid = lab.uuid();
    let memfd = example("domain-1cell-hugepages.xml", &uuid)
        .replace(
            "<hugepages/>",
            "<hugepages/>\n    <source type='memfd'/>\n    <access mode='shared'/>",
        )
        .replace("vm-1cell", "memfd");
    define(lab, &memfd);
    refused(lab, "memfd", "source type='memfd'");
    lab.sandbox.virsh_ok(&["undefine", "memfd"]).unwrap();

    // Ordinary memory: nothing for hugeprep to serve.
    let uuid = lab.uuid();
    let plain = example("domain-1cell-hugepages.xml", &uuid)
        .replace("<memoryBacking>\n    <hugepages/>\n  </memoryBacking>", "")
        .replace("vm-1cell", "plain");
    define(lab, &plain);
    refused(lab, "plain", "has no <hugepages>");

    // 1 GiB pages asked for, a 2M mount behind memory_backing_dir.
    let uuid = lab.uuid();
    let gig = example("domain-1cell-hugepages.xml", &uuid)
        .replace(
            "<hugepages/>",
            "<hugepages><page size='1' unit='GiB'/></hugepages>",
        )
        .replace(
            "<memory unit='MiB'>64</memory>",
            "<memory unit='GiB'>1</memory>",
        )
        .replace("vm-1cell", "gig");
    define(lab, &gig);
    refused(lab, "gig", "page size is 1G but memory_backing_dir");
    lab.sandbox.virsh_ok(&["undefine", "gig"]).unwrap();

    // memory_backing_dir on a hugetlbfs mount the daemon does not serve.
    let uuid = lab.uuid();
    let other = example("domain-1cell-hugepages.xml", &uuid).replace("vm-1cell", "elsewhere");
    define(lab, &other);
    let mnt = lab.env.dir.join("other-mount");
    std::fs::create_dir_all(&mnt).unwrap();
    nix::mount::mount(
        Some("hugetlbfs"),
        &mnt,
        Some("hugetlbfs"),
        nix::mount::MsFlags::empty(),
        Some("pagesize=2M"),
    )
    .unwrap();
    let backing = lab.backing.clone();
    lab.configure(|c| c.memory_backing_dir = mnt.join("libvirt"));
    refused(lab, "elsewhere", "is off the daemon's mounts");
    lab.configure(|c| c.memory_backing_dir = lab.env.dir.join("not-hugetlbfs"));
    std::fs::create_dir_all(lab.env.dir.join("not-hugetlbfs")).unwrap();
    refused(lab, "elsewhere", "is not on a hugetlbfs mount");
    lab.configure(|c| c.memory_backing_dir = backing);
    nix::mount::umount(&mnt).unwrap();
    for name in ["plain", "elsewhere"] {
        lab.sandbox.virsh_ok(&["undefine", name]).unwrap();
    }
    assert!(Env::names(&lab.env.state.join("libvirt-adopt")).is_empty());
}

fn refused_with(out: &Output, what: &[&str]) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "not refused: {out:?}");
    for w in what {
        assert!(err.contains(w), "{w:?} not in: {err}");
    }
    err
}

/// Regression: `--revert` defined the kept original over whatever the domain had become,
/// silently losing an edit made after the adoption. Now it restores only the definition
/// adopt made (as libvirt renders it, recorded right after the define), refuses otherwise
/// with nothing changed, and `--force` restores anyway; adopting twice never replaces the
/// kept original.
#[test]
fn a_domain_redefined_after_adopt_is_not_reverted_unasked() {
    if !tools_present() {
        return;
    }
    let mut lab = Lab::new("libvirt-adopt-redefined", 256 * MIB, 128 * MIB);
    let name = "vm-1cell";
    let uuid = lab.uuid();
    define(&lab, &example("domain-1cell-hugepages.xml", &uuid));
    let original = dumpxml(&lab, name);
    let kept_dir = lab.env.state.join("libvirt-adopt");
    let kept = kept_dir.join(format!("{uuid}.xml"));
    let record = kept_dir.join(format!("{uuid}.adopted.xml"));
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();

    ok(&adopt(&lab, &[name]));
    let adopted = dumpxml(&lab, name);
    assert_eq!(read(&kept), original);
    assert_eq!(read(&record), adopted, "the record is libvirt's rendering");

    // Adopting an adopted domain again: nothing changes, the original stays kept.
    let again = ok(&adopt(&lab, &[name]));
    assert!(again.contains("adopted already"), "{again}");
    assert!(again.contains("nothing to change"), "{again}");
    assert_eq!(dumpxml(&lab, name), adopted);
    assert_eq!(read(&kept), original);

    // An operator edits the adopted domain.
    let edited = adopted.replace(
        "</uuid>",
        "</uuid>\n  <description>edited after adopt</description>",
    );
    define(&lab, &edited);
    let redefined = dumpxml(&lab, name);
    assert!(redefined.contains("edited after adopt"), "{redefined}");

    // --revert refuses, names the domain and the ways on, and changes nothing.
    let err = refused_with(
        &adopt(&lab, &["--revert", name]),
        &[
            "domain vm-1cell was redefined after libvirt-adopt",
            "--revert --dry-run vm-1cell",
            "--revert --force vm-1cell",
            "losing the later change",
            "not changed: vm-1cell",
        ],
    );
    assert!(err.contains("nothing was changed"), "{err}");
    assert_eq!(dumpxml(&lab, name), redefined);
    assert_eq!(read(&kept), original);
    assert_eq!(read(&record), adopted);

    // --revert --dry-run shows what a forced revert would do, the later edit included.
    let out = adopt(&lab, &["--revert", "--dry-run", name]);
    let diff = ok(&out);
    assert!(
        diff.contains("-  <description>edited after adopt</description>"),
        "{diff}"
    );
    assert!(diff.contains("+    <hugepages"), "{diff}");
    assert!(diff.contains("vm-1cell (original)"), "{diff}");
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(note.contains("was redefined after libvirt-adopt"), "{note}");
    assert_eq!(dumpxml(&lab, name), redefined);

    // Adopting the edited (still file-backed) domain: nothing to change, original kept.
    let again = ok(&adopt(&lab, &[name]));
    assert!(again.contains("nothing to change"), "{again}");
    assert!(
        again.contains("the original kept from its adoption stays in"),
        "{again}"
    );
    assert_eq!(read(&kept), original);

    // The operator puts <hugepages> back by hand, with another vCPU count: adopting that
    // would replace the only copy of the original, so it is refused.
    let by_hand = original.replace(
        "<vcpu placement='static'>2</vcpu>",
        "<vcpu placement='static'>1</vcpu>",
    );
    assert_ne!(by_hand, original, "no <vcpu> to change in {original}");
    define(&lab, &by_hand);
    let by_hand = dumpxml(&lab, name);
    for extra in [&[][..], &["--dry-run"][..]] {
        let mut a = extra.to_vec();
        a.push(name);
        refused_with(
            &adopt(&lab, &a),
            &[
                "domain vm-1cell was adopted before and defined again since with <hugepages>",
                "is not replaced",
                "--revert --force vm-1cell",
            ],
        );
        assert_eq!(dumpxml(&lab, name), by_hand);
        assert_eq!(read(&kept), original);
        assert_eq!(read(&record), adopted);
    }

    // --force restores the original anyway and forgets it.
    let said = ok(&adopt(&lab, &["--revert", "--force", name]));
    assert!(said.contains("original definition restored"), "{said}");
    assert_eq!(dumpxml(&lab, name), original);
    assert!(Env::names(&kept_dir).is_empty());

    // --force belongs to --revert only.
    let out = adopt(&lab, &["--force", name]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--revert"),
        "{out:?}"
    );

    // Without the record (an adoption interrupted after its define), a revert cannot rule
    // out a later edit: refused unless forced.
    ok(&adopt(&lab, &[name]));
    std::fs::remove_file(&record).unwrap();
    refused_with(
        &adopt(&lab, &["--revert", name]),
        &["may have been redefined", "was not recorded", "--force"],
    );
    assert_eq!(read(&kept), original);
    ok(&adopt(&lab, &["--revert", "--force", name]));
    assert_eq!(dumpxml(&lab, name), original);

    // An adoption interrupted after keeping the original but before its define: the kept
    // original is the domain as it is, so adopting again goes ahead.
    std::fs::create_dir_all(&kept_dir).unwrap();
    std::fs::write(&kept, &original).unwrap();
    let said = ok(&adopt(&lab, &[name]));
    assert!(said.contains("adopted (2M pages"), "{said}");
    assert_eq!(read(&kept), original);
    assert_eq!(read(&record), dumpxml(&lab, name));
    ok(&adopt(&lab, &["--revert", name]));
    assert_eq!(dumpxml(&lab, name), original);

    // Adopt, then revert with nothing defined in between needs no --force, even across a
    // libvirtd restart (which parses and renders every definition again).
    ok(&adopt(&lab, &[name]));
    lab.sandbox.restart_libvirtd().unwrap();
    ok(&adopt(&lab, &["--revert", name]));
    assert_eq!(dumpxml(&lab, name), original);
    assert!(Env::names(&kept_dir).is_empty());

    lab.sandbox.virsh_ok(&["undefine", name]).unwrap();
    lab.assert_clean();
}
