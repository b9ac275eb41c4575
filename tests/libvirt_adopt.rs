//! `hugeprep libvirt-adopt` against a real libvirtd: the example domains of
//! `integration/libvirt/` written the `<hugepages>` way are rewritten into file-backed
//! shared memory (`--dry-run` first), start on the hook's leases, and `--revert` defines the
//! original again; what cannot be converted is refused with its reason and left as it was.

mod daemon_util;
mod libvirt_util;

use std::process::Output;

use daemon_util::{map_lease, Env, MIB};
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

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
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
