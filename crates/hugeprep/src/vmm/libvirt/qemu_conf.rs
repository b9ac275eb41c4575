//! Who a domain's QEMU runs as, learned from libvirt itself.
//!
//! libvirt's DAC security driver (always on for `qemu:///system`) runs every QEMU as one
//! user and group: the domain's `<seclabel model='dac'><label>` when the XML carries one
//! (libvirt adds it, `+UID:+GID`, before the `start begin` hook), else qemu.conf's `user` and
//! `group`, else the defaults its packagers compiled in. Those defaults appear in the
//! package's own qemu.conf as the commented lines `#user = "..."` and `#group = "..."`
//! (libvirt generates the file from `qemu.conf.in` with `@QEMU_USER@` filled in): Debian
//! and Ubuntu `libvirt-qemu`, Fedora and RHEL `qemu`, upstream `root`. QEMU's supplementary
//! groups are those of qemu.conf's user, even under a per-domain label (libvirt's
//! `virSecurityDACGetIds`).

use std::path::{Path, PathBuf};

use crate::perm::Credentials;

/// Where libvirt's QEMU driver reads its configuration.
pub const QEMU_CONF: &str = "/etc/libvirt/qemu.conf";

/// The settings of qemu.conf the hook and `doctor` need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QemuConf {
    /// `user`, when set.
    pub user: Option<String>,
    /// `group`, when set.
    pub group: Option<String>,
    /// The commented `#user = "..."`: the value libvirt was built with.
    pub default_user: Option<String>,
    /// The commented `#group = "..."`.
    pub default_group: Option<String>,
    /// `memory_backing_dir`, when set.
    pub memory_backing_dir: Option<PathBuf>,
}

/// `key = "value"` of one line, without comments; `None` for anything else.
fn string_setting<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let rest = line
        .trim()
        .strip_prefix(key)?
        .trim_start()
        .strip_prefix('=')?;
    let value = rest.trim();
    let value = value.strip_prefix('"')?;
    let end = value.find('"')?;
    Some(&value[..end])
}

impl QemuConf {
    /// Reads the settings from qemu.conf's text (libvirt's first occurrence of a key wins).
    pub fn parse(text: &str) -> QemuConf {
        let mut c = QemuConf::default();
        for line in text.lines() {
            let commented = line.trim_start().strip_prefix('#');
            let set = |slot: &mut Option<String>, key: &str, l: &str| {
                if slot.is_none() {
                    *slot = string_setting(l, key).map(str::to_string);
                }
            };
            match commented {
                Some(l) => {
                    // Only the exact form libvirt generates (`#user = "..."`), not prose.
                    if !l.starts_with(' ') {
                        set(&mut c.default_user, "user", l);
                        set(&mut c.default_group, "group", l);
                    }
                }
                None => {
                    set(&mut c.user, "user", line);
                    set(&mut c.group, "group", line);
                    if c.memory_backing_dir.is_none() {
                        c.memory_backing_dir =
                            string_setting(line, "memory_backing_dir").map(PathBuf::from);
                    }
                }
            }
        }
        c
    }

    /// Reads `path`; a missing file reads as empty (libvirt is not installed, or not here).
    pub fn read(path: &Path) -> std::io::Result<QemuConf> {
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(QemuConf::parse(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(QemuConf::default()),
            Err(e) => Err(e),
        }
    }

    /// The user QEMU runs as unless a domain says otherwise: `user`, else the packaged
    /// default, else libvirt's upstream default `root`.
    pub fn effective_user(&self) -> &str {
        self.user
            .as_deref()
            .or(self.default_user.as_deref())
            .unwrap_or("root")
    }

    /// The group, as [`QemuConf::effective_user`].
    pub fn effective_group(&self) -> &str {
        self.group
            .as_deref()
            .or(self.default_group.as_deref())
            .unwrap_or("root")
    }

    /// QEMU's credentials under this configuration (no per-domain label).
    pub fn qemu_user(&self) -> Result<QemuUser, String> {
        Ok(
            QemuUser::from_user_and_group(self.effective_user(), self.effective_group())?
                .with_groups_of(self),
        )
    }
}

/// A user as libvirt reads one (`virGetUserID`): `+N` is uid N, else a name in the user
/// database, else a number. Returns the uid, the user's primary group (its own gid when it
/// has no entry) and its name when it has one.
pub fn resolve_user(spec: &str) -> Result<(u32, u32, Option<String>), String> {
    use nix::unistd::{Uid, User};
    let by_uid = |uid: u32| match User::from_uid(Uid::from_raw(uid)) {
        Ok(Some(u)) => (uid, u.gid.as_raw(), Some(u.name)),
        _ => (uid, uid, None),
    };
    if let Some(n) = spec.strip_prefix('+') {
        return n
            .parse()
            .map(by_uid)
            .map_err(|_| format!("{spec:?} is not +UID"));
    }
    if let Ok(Some(u)) = User::from_name(spec) {
        return Ok((u.uid.as_raw(), u.gid.as_raw(), Some(u.name)));
    }
    if spec == "root" {
        // A system without a user database (an initramfs) still has root.
        return Ok((0, 0, Some(spec.to_string())));
    }
    spec.parse()
        .map(by_uid)
        .map_err(|_| format!("no user {spec:?} on this host"))
}

/// A group as libvirt reads one (`virGetGroupID`): `+N`, a name, or a number.
pub fn resolve_group(spec: &str) -> Result<u32, String> {
    use nix::unistd::Group;
    if let Some(n) = spec.strip_prefix('+') {
        return n.parse().map_err(|_| format!("{spec:?} is not +GID"));
    }
    if let Ok(Some(g)) = Group::from_name(spec) {
        return Ok(g.gid.as_raw());
    }
    if spec == "root" {
        // As for the user: a system without a group database (an initramfs) still has it.
        return Ok(0);
    }
    spec.parse()
        .map_err(|_| format!("no group {spec:?} on this host"))
}

/// The user and group a QEMU runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuUser {
    /// For messages: the user's name, or `+UID`.
    pub name: String,
    /// Its ids and supplementary groups.
    pub creds: Credentials,
}

impl QemuUser {
    /// From a DAC label `USER:GROUP` (each a name, a number or `+N`), as in
    /// `<seclabel model='dac'><label>`.
    pub fn from_label(label: &str) -> Result<QemuUser, String> {
        let (user, group) = label
            .split_once(':')
            .ok_or_else(|| format!("DAC label {label:?} is not USER:GROUP"))?;
        QemuUser::from_user_and_group(user, group)
    }

    /// `user` with `group` (each a name, a number or `+N`), no supplementary groups.
    fn from_user_and_group(user: &str, group: &str) -> Result<QemuUser, String> {
        let (uid, _, name) = resolve_user(user)?;
        let gid = resolve_group(group)?;
        Ok(QemuUser {
            name: name.unwrap_or_else(|| format!("+{uid}")),
            creds: Credentials {
                uid,
                gid,
                groups: Vec::new(),
            },
        })
    }

    /// From a user name or uid (the hook's `owner`): its primary group.
    pub fn from_user(spec: &str) -> Result<QemuUser, String> {
        let (uid, gid, name) = resolve_user(spec)?;
        Ok(QemuUser {
            name: name.unwrap_or_else(|| format!("+{uid}")),
            creds: Credentials {
                uid,
                gid,
                groups: Vec::new(),
            },
        })
    }

    /// With the supplementary groups libvirt gives every QEMU: those of `conf`'s user.
    pub fn with_groups_of(mut self, conf: &QemuConf) -> QemuUser {
        let driver_user = resolve_user(conf.effective_user()).ok();
        let driver_gid = resolve_group(conf.effective_group()).ok();
        if let (Some((_, _, Some(name))), Some(gid)) = (driver_user, driver_gid) {
            self.creds.groups = Credentials::with_groups_of(0, gid, Some(&name)).groups;
        }
        self
    }

    /// Whether this is root (no ownership to hand over).
    pub fn is_root(&self) -> bool {
        self.creds.uid == 0
    }
}

impl std::fmt::Display for QemuUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (uid {}, gid {})",
            self.name, self.creds.uid, self.creds.gid
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packaged_defaults_and_the_settings_are_read() {
        let debian = "# Some examples of valid values are:\n\
                      #\n\
                      #       user = \"qemu\"   # A user named \"qemu\"\n\
                      #       user = \"+0\"     # Super user (uid=0)\n\
                      #user = \"libvirt-qemu\"\n\
                      #group = \"libvirt-qemu\"\n\
                      #memory_backing_dir = \"/var/lib/libvirt/qemu/ram\"\n";
        let c = QemuConf::parse(debian);
        assert_eq!(c.user, None);
        assert_eq!(c.default_user.as_deref(), Some("libvirt-qemu"));
        assert_eq!(c.effective_user(), "libvirt-qemu");
        assert_eq!(c.effective_group(), "libvirt-qemu");
        assert_eq!(c.memory_backing_dir, None);
        let set = format!(
            "{debian}user = \"qemu\"\ngroup = \"+107\"\nuser = \"root\"\n\
             memory_backing_dir = \"/dev/hugepages/libvirt-backing\" # the snippet\n"
        );
        let c = QemuConf::parse(&set);
        assert_eq!(
            c.effective_user(),
            "qemu",
            "the first setting wins, as in libvirt"
        );
        assert_eq!(c.effective_group(), "+107");
        assert_eq!(
            c.memory_backing_dir,
            Some(PathBuf::from("/dev/hugepages/libvirt-backing"))
        );
        assert_eq!(QemuConf::parse("").effective_user(), "root");
    }

    #[test]
    fn users_and_labels_as_libvirt_reads_them() {
        assert_eq!(resolve_user("root").unwrap().0, 0);
        assert_eq!(resolve_user("+0").unwrap(), (0, 0, Some("root".into())));
        assert_eq!(resolve_user("+4000000").unwrap(), (4000000, 4000000, None));
        let e = resolve_user("no-such-user-hugeprep").unwrap_err();
        assert!(e.contains("no user \"no-such-user-hugeprep\""), "{e}");
        assert_eq!(resolve_group("+5").unwrap(), 5);
        assert_eq!(resolve_group("root").unwrap(), 0);
        let q = QemuUser::from_label("+0:+0").unwrap();
        assert!(q.is_root());
        assert_eq!(q.name, "root");
        let q = QemuUser::from_label("+4000000:+4000001").unwrap();
        assert_eq!((q.creds.uid, q.creds.gid), (4000000, 4000001));
        assert_eq!(q.to_string(), "+4000000 (uid 4000000, gid 4000001)");
        assert!(QemuUser::from_label("root").is_err());
    }
}
