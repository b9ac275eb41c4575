//! The hook's configuration file (`/etc/hugeprep/libvirt-hook.toml`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{HookError, Result};

/// Where the hook reads its configuration unless told otherwise.
pub const DEFAULT_CONFIG: &str = "/etc/hugeprep/libvirt-hook.toml";

/// The `memory_backing_dir` every shipped file and `doctor` recommend: a directory of its
/// own on the default hugetlbfs mount (libvirt's `<hugepages/>` domains use
/// `/dev/hugepages/libvirt`).
pub const RECOMMENDED_MEMORY_BACKING_DIR: &str = "/dev/hugepages/libvirt-backing";

/// What to do when a domain's memory cannot come from hugeprep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// Abort the start with one line saying what is missing.
    #[default]
    Fail,
    /// Let QEMU allocate (and the kernel zero) the memory itself.
    Cold,
}

/// The hook's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// The daemon's socket.
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// `memory_backing_dir` of qemu.conf: a directory on the daemon's hugetlbfs mount
    /// (hard links cannot cross file systems).
    pub memory_backing_dir: PathBuf,
    /// When the pool cannot serve a domain.
    #[serde(default)]
    pub on_shortage: Fallback,
    /// When the daemon does not answer: unreachable, or busy (503) for longer than
    /// `daemon_retry_s`.
    #[serde(default)]
    pub on_daemon_down: Fallback,
    /// Seconds to keep retrying a daemon that refuses connections (restarting) or answers
    /// 503 (shutting down, admission full; its `Retry-After` is honoured) before
    /// `on_daemon_down` applies; 0: no retry.
    #[serde(default = "default_retry")]
    pub daemon_retry_s: u64,
    /// Seconds to wait for each answer of the daemon (a cold lease faults its memory first).
    #[serde(default = "default_timeout")]
    pub timeout_s: u64,
    /// User to hand lease files to when the domain XML carries no DAC label (a hook run by
    /// hand; libvirt always passes one at `start begin`). Unset: qemu.conf's `user`, or the
    /// default libvirt was built with. Must exist.
    #[serde(default)]
    pub owner: Option<String>,
    /// libvirt's qemu.conf, read for QEMU's user when neither the domain nor `owner` names
    /// one.
    #[serde(default = "default_qemu_conf")]
    pub qemu_conf: PathBuf,
    /// Seconds after which a hook lease no longer linked into libvirt's directory is released
    /// by the next hook call or `--reconcile`.
    #[serde(default = "default_stale")]
    pub stale_after_s: u64,
    /// Long-term pin every page of the domain's leases before QEMU starts (for domains with
    /// VFIO devices; see docs/pinning.md).
    #[serde(default)]
    pub pin: bool,
    /// Whether libvirtd runs in a UTF-8 locale (decides how it cuts non-ASCII names to 20
    /// characters); unset: read from libvirtd's environment.
    #[serde(default)]
    pub utf8_locale: Option<bool>,
}

fn default_socket() -> PathBuf {
    PathBuf::from(crate::client::DEFAULT_SOCKET)
}

fn default_timeout() -> u64 {
    30
}

fn default_retry() -> u64 {
    10
}

fn default_qemu_conf() -> PathBuf {
    PathBuf::from(super::qemu_conf::QEMU_CONF)
}

fn default_stale() -> u64 {
    60
}

impl HookConfig {
    /// Defaults for `memory_backing_dir`.
    pub fn new(memory_backing_dir: impl Into<PathBuf>) -> HookConfig {
        HookConfig {
            socket: default_socket(),
            memory_backing_dir: memory_backing_dir.into(),
            on_shortage: Fallback::Fail,
            on_daemon_down: Fallback::Fail,
            daemon_retry_s: default_retry(),
            timeout_s: default_timeout(),
            owner: None,
            qemu_conf: default_qemu_conf(),
            stale_after_s: default_stale(),
            pin: false,
            utf8_locale: None,
        }
    }

    /// Reads and checks the file.
    pub fn load(path: &Path) -> Result<HookConfig> {
        let bad = |message: String| HookError::Config {
            path: path.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let config: HookConfig = toml::from_str(&text).map_err(|e| bad(e.message().into()))?;
        if !config.memory_backing_dir.is_absolute() {
            return Err(bad(format!(
                "memory_backing_dir {} must be an absolute path",
                config.memory_backing_dir.display()
            )));
        }
        if config.timeout_s == 0 || config.timeout_s > 3600 {
            return Err(bad(format!(
                "timeout_s {} must be between 1 and 3600",
                config.timeout_s
            )));
        }
        if config.daemon_retry_s > 600 {
            return Err(bad(format!(
                "daemon_retry_s {} must be at most 600",
                config.daemon_retry_s
            )));
        }
        // Checked at every load, so a user that does not exist fails the start before any
        // lease is taken.
        if let Some(owner) = &config.owner {
            super::qemu_conf::resolve_user(owner)
                .map_err(|e| bad(format!("owner: {e} (QEMU's user; or leave owner unset)")))?;
        }
        Ok(config)
    }

    /// The file as TOML (tests and the sandbox write it).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_round_trip() {
        let c: HookConfig = toml::from_str("memory_backing_dir = \"/dev/hugepages/vm\"").unwrap();
        assert_eq!(c.on_shortage, Fallback::Fail);
        assert_eq!(c.socket, PathBuf::from(crate::client::DEFAULT_SOCKET));
        assert!(!c.pin, "pinning is opt-in");
        let mut c2 = c.clone();
        c2.on_daemon_down = Fallback::Cold;
        c2.pin = true;
        let back: HookConfig = toml::from_str(&c2.to_toml()).unwrap();
        assert_eq!(back, c2);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let dir = std::env::temp_dir().join(format!("hugeprep-hookcfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        for (text, needle) in [
            ("memory_backing_dir = \"/x\"\ncolour = 1", "colour"),
            ("memory_backing_dir = \"x\"", "absolute"),
            (
                "memory_backing_dir = \"/x\"\non_shortage = \"maybe\"",
                "maybe",
            ),
            ("memory_backing_dir = \"/x\"\ntimeout_s = 0", "timeout_s"),
            (
                "memory_backing_dir = \"/x\"\ndaemon_retry_s = 601",
                "daemon_retry_s",
            ),
            (
                "memory_backing_dir = \"/x\"\nowner = \"no-such-user-hugeprep\"",
                "owner: no user \"no-such-user-hugeprep\"",
            ),
            (
                "memory_backing_dir = \"/x\"\nowner = \"libvirt-qmeu\"",
                "owner: no user \"libvirt-qmeu\" on this host",
            ),
            (
                "memory_backing_dir = \"/x\"\nowner = \"\"",
                "owner: no user \"\"",
            ),
            (
                "memory_backing_dir = \"/x\"\non_daemon_down = \"colder\"",
                "colder",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = HookConfig::load(&path).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_shipped_example_is_valid() {
        let text = include_str!("../../../../../integration/libvirt/libvirt-hook.toml");
        let c: HookConfig = toml::from_str(text).unwrap();
        assert_eq!(c.owner, None, "QEMU's user comes from libvirt");
        assert_eq!(
            c.memory_backing_dir,
            PathBuf::from(RECOMMENDED_MEMORY_BACKING_DIR)
        );
    }
}
