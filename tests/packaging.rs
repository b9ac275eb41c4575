//! The packages: the .deb passes lintian with no errors and no licence tag, and ships the
//! DEP-5 copyright; the RPM (packaging/rpm) builds offline as build systems build it
//! (`scripts/package-rpm`: source and vendored-crate tarballs, then `rpmbuild -ba` under
//! `unshare -n`, no network at all), parses (`rpmspec --parse`), passes rpmlint with no
//! errors and no licence tag, keeps the binary's symbols in its debuginfo package, ships the
//! licence texts with `%license` and installs the same files, modes and conffiles as the
//! .deb. rpm on Debian has no systemd-rpm-macros: tests/packaging/macros.systemd stands in
//! for them. The mandatory access
//! control snippets the packages ship (packaging/mac) parse with the tools that work without
//! the LSM: the AppArmor rules inside a profile that includes the distribution's
//! `abstractions/libvirt-qemu` (`apparmor_parser --skip-kernel-load`), the SELinux module
//! built with the refpolicy development files (m4 interfaces, `checkmodule`,
//! `semodule_package`); and a broken rule in each is refused, so the check can fail.

#[path = "systemd_util/mod.rs"]
mod systemd_util;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The .deb, built once for the tests of this file (they run in parallel).
fn deb() -> Option<PathBuf> {
    static DEB: OnceLock<Option<PathBuf>> = OnceLock::new();
    DEB.get_or_init(systemd_util::package).clone()
}

/// True when `tool --version` runs; `missing_tool` (fails under scripts/test) otherwise.
fn have(tool: &str, package: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        hugeprep::testing::missing_tool(&format!(
            "{tool} is not installed (apt install {package}; scripts/test installs it)"
        ));
    }
    ok
}

/// Runs `cmd`; panics with its output when it fails. Returns stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The lines of a linter's output that are errors (`E: ` tags).
fn errors(report: &str) -> Vec<&str> {
    report.lines().filter(|l| l.contains(" E: ")).collect()
}

/// The lines of a linter's output about the licence or copyright, whatever their level:
/// lintian's `copyright-*` and `*-license*` tags, rpmlint's `*license*` ones.
fn licence_tags(report: &str) -> Vec<&str> {
    report
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            (l.contains(" e: ") || l.contains(" w: ") || l.contains(" i: ") || l.contains(" p: "))
                && (l.contains("license") || l.contains("licence") || l.contains("copyright"))
        })
        .collect()
}

#[test]
fn deb_passes_lintian_without_errors() {
    if !have("lintian", "lintian") {
        return;
    }
    let Some(deb) = deb() else {
        return;
    };
    let out = Command::new("lintian")
        .args(["--tag-display-limit", "0"])
        .arg(&deb)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    eprintln!("lintian {}:\n{report}", deb.display());
    let errs = errors(&report);
    assert!(errs.is_empty(), "lintian errors:\n{}", errs.join("\n"));
    let tags = licence_tags(&report);
    assert!(
        tags.is_empty(),
        "lintian licence tags:\n{}",
        tags.join("\n")
    );
    // The DEP-5 copyright is the one installed, with both licences' texts.
    let copyright = run(Command::new("sh").arg("-c").arg(format!(
        "dpkg-deb --fsys-tarfile {} | tar -xOf - ./usr/share/doc/hugeprep/copyright",
        deb.display()
    )));
    assert_eq!(
        copyright,
        std::fs::read_to_string(root().join("packaging/debian/copyright")).unwrap()
    );
    assert!(copyright
        .starts_with("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"));
    assert!(copyright.contains("License: Apache-2.0 or BSD-3-Clause"));
    assert!(copyright.contains("Redistribution and use in source and binary forms"));
}

/// The licence texts of the source are the two licences Cargo.toml names.
#[test]
fn licence_texts_are_present() {
    let read =
        |p: &str| std::fs::read_to_string(root().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    assert!(read("Cargo.toml").contains("license = \"Apache-2.0 OR BSD-3-Clause\""));
    assert!(read("LICENSE-APACHE")
        .contains("Apache License\n                           Version 2.0, January 2004"));
    assert!(read("LICENSE-BSD-3-Clause").contains("Neither the name of the copyright holder"));
}

/// cargo-deb takes the units of `hugeprep-reserve` and of the reconcile timer from the
/// maintainer-scripts directory (it would pick up `hugeprep.socket` from `service/` as
/// `hugeprep-reserve.socket`): what is there must stay the units in `service/`.
#[test]
fn deb_reserve_and_reconcile_units_are_the_ones_in_service() {
    let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap();
    for unit in [
        "hugeprep-reserve.service",
        "hugeprep-libvirt-reconcile.service",
        "hugeprep-libvirt-reconcile.timer",
    ] {
        assert_eq!(
            read(&format!("packaging/debian/{unit}")),
            read(&format!("service/{unit}")),
            "link service/{unit} from packaging/debian/"
        );
    }
}

/// Runs `cmd`; its status and both outputs.
fn try_run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn apparmor_snippet_parses_in_libvirts_qemu_abstraction() {
    if !have_file("apparmor_parser", "/usr/sbin/apparmor_parser", "apparmor")
        || !have_file(
            "libvirt's AppArmor abstraction",
            "/etc/apparmor.d/abstractions/libvirt-qemu",
            "libvirt-daemon-system",
        )
    {
        return;
    }
    let dir = std::env::temp_dir().join(format!("hugeprep-aa-{}", std::process::id()));
    let _cleanup = RemoveOnDrop(dir.clone());
    std::fs::create_dir_all(&dir).unwrap();
    let snippet = root().join("packaging/mac/apparmor-libvirt-qemu");
    let check = |rules: &Path| {
        // As virt-aa-helper's TEMPLATE.qemu writes a domain's profile.
        let profile = dir.join("libvirt-check");
        std::fs::write(
            &profile,
            format!(
                "#include <tunables/global>
profile libvirt-check flags=(attach_disconnected) {{
  #include <abstractions/libvirt-qemu>
  include \"{}\"
}}
",
                rules.display()
            ),
        )
        .unwrap();
        try_run(
            Command::new("apparmor_parser")
                .args(["--skip-kernel-load", "--skip-cache", "--preprocess"])
                .arg(&profile),
        )
    };
    let (ok, text) = check(&snippet);
    assert!(ok, "apparmor_parser refused {}:\n{text}", snippet.display());
    assert!(text.contains("/dev/hugepages1G/libvirt-backing"), "{text}");
    let broken = dir.join("broken");
    std::fs::write(&broken, "  owner /dev/hugepages/x rwz,\n").unwrap();
    assert!(!check(&broken).0, "a broken rule was accepted");
}

#[test]
fn selinux_module_builds_with_the_refpolicy_interfaces() {
    let makefile = Path::new("/usr/share/selinux/devel/Makefile");
    if !have("checkmodule", "checkpolicy")
        || !have_file(
            "semodule_package",
            "/usr/bin/semodule_package",
            "semodule-utils",
        )
        || !have_file(
            "the refpolicy development files",
            makefile.to_str().unwrap(),
            "selinux-policy-dev",
        )
    {
        return;
    }
    let dir = std::env::temp_dir().join(format!("hugeprep-se-{}", std::process::id()));
    let _cleanup = RemoveOnDrop(dir.clone());
    std::fs::create_dir_all(&dir).unwrap();
    let te = std::fs::read_to_string(root().join("packaging/mac/hugeprep.te")).unwrap();
    let build = |name: &str, text: &str| {
        std::fs::write(dir.join(format!("{name}.te")), text).unwrap();
        let (ok, out) = try_run(
            Command::new("make")
                .current_dir(&dir)
                .arg("-f")
                .arg(makefile)
                .arg(format!("{name}.pp")),
        );
        (ok && dir.join(format!("{name}.pp")).exists(), out)
    };
    let (ok, out) = build("hugeprep", &te);
    assert!(ok, "the SELinux module does not build:\n{out}");
    // The module holds the rule: svirt_t may map hugetlbfs_t files.
    let pp = std::fs::read(dir.join("hugeprep.pp")).unwrap();
    let has = |s: &str| pp.windows(s.len()).any(|w| w == s.as_bytes());
    assert!(
        has("svirt_t") && has("hugetlbfs_t"),
        "rule missing from the package"
    );
    let broken = te.replace("fs_mmap_rw_hugetlbfs_files", "fs_no_such_interface");
    assert!(
        !build("broken", &broken).0,
        "an unknown interface was accepted"
    );
}

/// The README the package installs in /usr/share/hugeprep/libvirt names only files the
/// package installs (it once named the source tree's sandbox.sh and service/ paths).
#[test]
fn packaged_libvirt_readme_names_only_installed_files() {
    let Some(deb) = deb() else {
        return;
    };
    let listing = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    let installed: BTreeSet<&str> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .map(|p| p.trim_start_matches('.'))
        .collect();
    let readme = std::fs::read_to_string(root().join("packaging/share/libvirt-README.md")).unwrap();
    assert!(
        installed.contains("/usr/share/hugeprep/libvirt/README.md"),
        "{installed:?}"
    );
    let ours = [
        "/usr/share/hugeprep/",
        "/usr/share/doc/hugeprep/",
        "/usr/lib/systemd/system/hugeprep",
        "/etc/hugeprep/",
        "/usr/bin/hugeprep",
    ];
    let mut named = 0;
    for span in readme.split('`').skip(1).step_by(2) {
        for word in span.split_whitespace() {
            let word = word.trim_end_matches([',', ';', ')']);
            if !ours.iter().any(|p| word.starts_with(p)) || word.ends_with('/') {
                continue;
            }
            named += 1;
            assert!(
                installed.contains(word),
                "the packaged README names {word}, which the package does not install"
            );
        }
    }
    assert!(named >= 8, "only {named} paths checked");
}

/// True when `path` exists; `missing_tool` (fails under scripts/test) otherwise.
fn have_file(what: &str, path: &str, package: &str) -> bool {
    let ok = Path::new(path).exists();
    if !ok {
        hugeprep::testing::missing_tool(&format!(
            "{what} is not installed (apt install {package}; scripts/test installs it)"
        ));
    }
    ok
}

#[test]
fn rpm_builds_offline_lints_and_installs_the_files_of_the_deb() {
    if !have("rpmspec", "rpm")
        || !have("rpmbuild", "rpm")
        || !have("rpmlint", "rpmlint")
        || !have("unshare", "util-linux")
        || !have("find-debuginfo", "debugedit")
    {
        return;
    }
    let spec = root().join("packaging/rpm/hugeprep.spec");
    let macros = root().join("tests/packaging/macros.systemd");
    let script = root().join("scripts/package-rpm");
    // Kept between runs (target/ is the checkout's): the sources are made anew each time,
    // the cargo target directory lets a second run compile hugeprep only.
    let out = root().join("target/rpm");
    let cargo_target = root().join("target/rpm-cargo");

    // The sources: the tree and every crate (this step may use the network or the cache).
    run(Command::new(&script).arg("sources").arg(&out));
    let version = "0.1.0";
    for tarball in [
        format!("hugeprep-{version}.tar.gz"),
        format!("hugeprep-{version}-vendor.tar.gz"),
    ] {
        assert!(out.join(&tarball).is_file(), "no {tarball}");
    }

    // Parses, with every macro expanded (an unknown one would stay as `%name` in a scriptlet).
    let parsed = run(Command::new("rpmspec")
        .arg("--parse")
        .arg("--load")
        .arg(&macros)
        .arg("--define")
        .arg(format!("_sourcedir {}", out.display()))
        .arg(&spec));
    for left in [
        "%systemd",
        "%tmpfiles",
        "%sysusers",
        "%{_unitdir}",
        "%{_tmpfilesdir}",
    ] {
        assert!(!parsed.contains(left), "{left} not expanded:\n{parsed}");
    }
    assert!(parsed.contains("groupadd -r kvm"), "{parsed}");

    // The build, with no network at all: a network namespace of its own holds only a
    // loopback that is down.
    let (offline, text) = try_run(Command::new("unshare").args(["-n", "--", "sh", "-c"]).arg(
        "! getent ahosts index.crates.io >/dev/null 2>&1 && ! ip -o link show up 2>/dev/null | grep -q .",
    ));
    assert!(offline, "unshare -n left a network: {text}");
    let rpm = run(Command::new("unshare")
        .args(["-n", "--"])
        .arg(&script)
        .arg("build")
        .arg(&out)
        .arg("--nodeps")
        .arg("--load")
        .arg(&macros)
        .arg("--define")
        .arg(format!("cargo_target_dir {}", cargo_target.display())));
    let rpm = PathBuf::from(rpm.trim());
    let debuginfo = std::fs::read_dir(rpm.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("hugeprep-debuginfo-"))
        })
        .expect("rpmbuild wrote no debuginfo package");

    // The symbols are in the debuginfo package, not lost: the binary's .debug file.
    let debug_files = run(Command::new("rpm").arg("-qlp").arg(&debuginfo));
    assert!(
        debug_files
            .lines()
            .any(|l| l.starts_with("/usr/lib/debug/usr/bin/hugeprep") && l.ends_with(".debug")),
        "{debug_files}"
    );
    // The licence texts, with %license.
    let licences = run(Command::new("rpm")
        .args(["-qp", "--licensefiles"])
        .arg(&rpm));
    for name in ["LICENSE-APACHE", "LICENSE-BSD-3-Clause"] {
        assert!(
            licences
                .lines()
                .any(|l| l.starts_with("/usr/share/licenses/hugeprep")
                    && l.ends_with(&format!("/{name}"))),
            "{licences}"
        );
    }

    // Lints (the spec and both packages): no errors, no licence tag. The rpmlintrc filters
    // what the distribution decides (signing, Packager, Group); tests/packaging/rpmlint.toml
    // gives Debian's rpmlint the licence list Fedora's has.
    let out_lint = Command::new("rpmlint")
        .arg("-c")
        .arg(root().join("tests/packaging/rpmlint.toml"))
        .arg("-r")
        .arg(root().join("packaging/rpm/hugeprep.rpmlintrc"))
        .arg(&spec)
        .arg(&rpm)
        .arg(&debuginfo)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out_lint.stdout);
    eprintln!("rpmlint:\n{report}");
    let errs = errors(&report);
    assert!(errs.is_empty(), "rpmlint errors:\n{}", errs.join("\n"));
    let tags = licence_tags(&report);
    assert!(
        tags.is_empty(),
        "rpmlint licence tags:\n{}",
        tags.join("\n")
    );

    // The same files with the same modes as the .deb, and the same conffiles.
    let Some(deb) = deb() else {
        return;
    };
    let rpm_files = run(Command::new("rpm")
        .args(["-qp", "--qf", "[%{FILEMODES:perms} %{FILENAMES}\\n]"])
        .arg(&rpm));
    let deb_files = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    let deb_files = deb_files.lines().map(|l| {
        let mode = l.split_whitespace().next().unwrap_or("");
        let path = l.split_whitespace().last().unwrap_or("");
        format!("{mode} {}", path.trim_start_matches('.'))
    });
    let (rpm_set, rpm_docs) = files(rpm_files.lines().map(str::to_string));
    let (deb_set, deb_docs) = files(deb_files);
    assert!(
        deb_set.contains("-rwxr-xr-x /usr/bin/hugeprep")
            && deb_set.contains("-rw-r--r-- /usr/lib/systemd/system/hugeprep.service")
            && deb_set
                .contains("-rw-r--r-- /usr/lib/systemd/system/hugeprep-libvirt-reconcile.timer"),
        "{deb_set:?}"
    );
    assert_eq!(
        rpm_set.symmetric_difference(&deb_set).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "files only in one of the packages"
    );
    assert_eq!(rpm_docs, deb_docs, "documentation");
    let rpm_conf: BTreeSet<String> = run(Command::new("rpm").arg("-qcp").arg(&rpm))
        .lines()
        .map(str::to_string)
        .collect();
    let deb_conf: BTreeSet<String> = run(Command::new("dpkg-deb")
        .arg("--info")
        .arg(&deb)
        .arg("conffiles"))
    .lines()
    .map(str::to_string)
    .collect();
    assert_eq!(rpm_conf, deb_conf, "conffiles");
}

/// Splits `MODE PATH` lines into the installed files (directories and rpm's build-id links
/// left out; zsh's directory is the distribution's) and the documentation's file names
/// (Debian adds its copyright and changelog; rpm names the directory with the version and
/// puts the licence texts in /usr/share/licenses, checked on their own).
fn files(lines: impl Iterator<Item = String>) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut installed = BTreeSet::new();
    let mut docs = BTreeSet::new();
    for line in lines {
        if line.starts_with('d')
            || line.contains("/.build-id/")
            || line.contains(" /usr/share/licenses/")
        {
            continue;
        }
        if let Some(rest) = line.split_once(" /usr/share/doc/").map(|(_, r)| r) {
            let name = rest.rsplit('/').next().unwrap_or(rest);
            if name != "copyright" && name != "changelog.Debian.gz" {
                docs.insert(name.to_string());
            }
            continue;
        }
        installed.insert(line.replace("/zsh/vendor-completions/", "/zsh/site-functions/"));
    }
    (installed, docs)
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
