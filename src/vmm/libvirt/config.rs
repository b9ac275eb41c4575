//! The hook's configuration file (`/etc/hugeprep/libvirt-hook.toml`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{HookError, Result};

/// Where the hook reads its configuration unless told otherwise.
pub const DEFAULT_CONFIG: &str = "/etc/hugeprep/libvirt-hook.toml";

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
    /// When the daemon does not answer.
    #[serde(default)]
    pub on_daemon_down: Fallback,
    /// Seconds to wait for each answer of the daemon (a cold lease faults its memory first).
    #[serde(default = "default_timeout")]
    pub timeout_s: u64,
    /// User to hand lease files to (QEMU's user, `libvirt-qemu` on Debian), if not root.
    #[serde(default)]
    pub owner: Option<String>,
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
            timeout_s: default_timeout(),
            owner: None,
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
        if let Some(owner) = &config.owner {
            // A misspelt owner would fail every VM start at its lease; say so at once.
            if owner.trim().is_empty() {
                return Err(bad(
                    "owner \"\": an empty owner names nobody: give the VMM's user (libvirt-qemu on Debian)".into(),
                ));
            }
            if !matches!(nix::unistd::User::from_name(owner), Ok(Some(_))) {
                return Err(bad(format!(
                    "owner {owner:?} names no user on this host: give the VMM's user (libvirt-qemu on Debian)"
                )));
            }
        }
        if config.timeout_s == 0 || config.timeout_s > 3600 {
            return Err(bad(format!(
                "timeout_s {} must be between 1 and 3600",
                config.timeout_s
            )));
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
                "memory_backing_dir = \"/x\"\nowner = \"libvirt-qmeu\"",
                "owner \"libvirt-qmeu\" names no user on this host",
            ),
            ("memory_backing_dir = \"/x\"\nowner = \"\"", "owner \"\""),
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
        let text = include_str!("../../../integration/libvirt/libvirt-hook.toml");
        let c: HookConfig = toml::from_str(text).unwrap();
        assert_eq!(c.owner.as_deref(), Some("libvirt-qemu"));
    }
}
