//! The libvirt cases: `virsh create --paused` of a transient, diskless domain until virsh
//! returns (the domain started, its memory prepared), against a private libvirtd whose QEMU
//! hook is `hugeprep libvirt-hook` talking to the benchmark's daemon.
//!
//! - immediate: `<hugepages/>` + `<allocation mode='immediate' threads='N'/>` (libvirt
//!   passes QEMU a directory on its hugetlbfs mount; QEMU preallocates a fresh file);
//! - floor: the same file-backed, shared domain as hugeprep's, with no allocation, and the
//!   hook configured with no daemon to ask and `on_daemon_down = "cold"`: libvirt and QEMU
//!   make the file themselves (the hook still runs, as it would on a host that has it);
//! - hugeprep: `<source type='file'/><access mode='shared'/>`: the hook links a warm lease
//!   at the path QEMU opens;
//! - immediate on a lease: the same plus `<allocation mode='immediate' threads='N'/>`;
//! - hugeprep with `<discard/>` (OpenStack Nova's file-backed memory): QEMU punches the
//!   lease's pages out when it stops and the pool refills them.
//!
//! QEMU runs as the distribution's package configures it (`libvirt-qemu` on Debian, with
//! dynamic ownership and its private /dev); `libvirt-root` runs a second libvirtd with
//! QEMU as root beside it, on the immediate, floor and hugeprep cases.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{Case, Result, Starter, VmStartBenchConfig, VmStartBenchError, Vmm, World};
use hugeprep::page_size::PageSize;
use hugeprep::vmm::libvirt::sandbox::{QemuAs, Sandbox};
use hugeprep::vmm::libvirt::{Fallback, HookConfig};

/// What libvirt needs on this machine.
const TOOLS: [(&str, &str); 3] = [
    ("/usr/sbin/libvirtd", "libvirt-daemon-system"),
    ("/usr/sbin/virtlogd", "libvirt-daemon-system"),
    ("/usr/bin/virsh", "libvirt-clients"),
];

/// Whether libvirtd, virtlogd and virsh are installed; otherwise what to install.
pub(super) fn tools_present() -> std::result::Result<(), String> {
    for (tool, package) in TOOLS {
        if !Path::new(tool).exists() {
            return Err(format!("{tool} missing (apt install {package})"));
        }
    }
    Ok(())
}

/// Replaces the hook's configuration atomically (the hook may be reading it).
fn write_config(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| VmStartBenchError::Io {
            op: "write the hook's configuration",
            source,
        })
}

/// A private libvirtd for one size's world.
pub(crate) struct LibvirtStarter {
    sandbox: Sandbox,
    vmm: Vmm,
    config_path: PathBuf,
    /// The hook's configuration: the world's daemon.
    served: String,
    /// The hook's configuration for the floor: no daemon, start cold.
    cold: String,
    xml_dir: PathBuf,
    qemu: PathBuf,
    next_uuid: u64,
}

impl LibvirtStarter {
    /// Starts libvirtd with `memory_backing_dir` on the pool's mount and the hook pointed at
    /// the world's daemon.
    pub fn up(cfg: &VmStartBenchConfig, world: &World, vmm: Vmm) -> Result<LibvirtStarter> {
        // Each libvirtd of the run in a directory of its own.
        let tmp = world.tmp.join(vmm.name());
        std::fs::create_dir_all(&tmp).map_err(|source| VmStartBenchError::Io {
            op: "make the libvirt directory",
            source,
        })?;
        let mut starter =
            LibvirtStarter::up_on(cfg, &world.pool_mount, &tmp, world.daemon.socket(), vmm)?;
        starter.vmm = vmm;
        Ok(starter)
    }

    /// [`LibvirtStarter::up`] on a pool mount, a run directory and a daemon socket (the
    /// boot storm's world).
    pub(super) fn up_on(
        cfg: &VmStartBenchConfig,
        pool_mount: &Path,
        tmp: &Path,
        socket: &Path,
        vmm: Vmm,
    ) -> Result<LibvirtStarter> {
        let backing = pool_mount.join(format!("{}-backing", vmm.name()));
        let mut config = HookConfig::new(&backing);
        config.socket = socket.to_path_buf();
        let config_path = tmp.join("libvirt-hook.toml");
        let served = config.to_toml();
        config.socket = tmp.join("no-daemon.sock");
        config.on_daemon_down = Fallback::Cold;
        // A daemon that is not there at all: no retry, straight to cold.
        config.daemon_retry_s = 0;
        let cold = config.to_toml();
        write_config(&config_path, &served)?;
        let hook = format!(
            "{} libvirt-hook --config {}",
            cfg.hook_binary.display(),
            config_path.display()
        );
        let qemu = if vmm == Vmm::LibvirtRoot {
            QemuAs::Root
        } else {
            QemuAs::Packaged
        };
        let sandbox = Sandbox::up_as(&tmp.join("libvirt"), &backing, Some(&hook), &qemu)?;
        Ok(LibvirtStarter {
            sandbox,
            vmm,
            config_path,
            served,
            cold,
            xml_dir: tmp.to_path_buf(),
            qemu: cfg.qemu.clone(),
            next_uuid: 0,
        })
    }

    fn domain_xml(&self, world: &World, case: Case, uuid: &str) -> String {
        self.domain_xml_of(world.size, world.page_size, world.threads, case, uuid)
    }

    /// The domain of `size` bytes on pages of `page_size` for `case`, with `threads` for an
    /// immediate allocation. Pages other than 2M are named: `<hugepages>`' page size, and
    /// hugeprep's `<metadata>` for the hook.
    pub(super) fn domain_xml_of(
        &self,
        size: u64,
        page_size: PageSize,
        threads: usize,
        case: Case,
        uuid: &str,
    ) -> String {
        let two_meg = page_size == PageSize::Size2M;
        let backing = match case {
            Case::Immediate if two_meg => {
                format!("<hugepages/><allocation mode='immediate' threads='{threads}'/>")
            }
            Case::Immediate => format!(
                "<hugepages><page size='{}' unit='KiB'/></hugepages>\
                 <allocation mode='immediate' threads='{threads}'/>",
                page_size.bytes() >> 10
            ),
            Case::Floor | Case::Hugeprep | Case::Present => {
                "<source type='file'/><access mode='shared'/>".into()
            }
            Case::HugeprepDiscard => {
                "<source type='file'/><access mode='shared'/><discard/>".into()
            }
            Case::ImmediateOnLease => format!(
                "<source type='file'/><access mode='shared'/>\
                 <allocation mode='immediate' threads='{threads}'/>"
            ),
        };
        let metadata = if two_meg {
            String::new()
        } else {
            format!(
                "\n  <metadata><hp:memory xmlns:hp='urn:hugeprep:libvirt:1' page_size='{}'/></metadata>",
                page_size.name()
            )
        };
        // arch-capabilities off: KVM on AMD hosts refuses QEMU's MSR 0x10a write with -cpu host.
        format!(
            "<domain type='kvm'>
  <name>vm-start-{uuid}</name>
  <uuid>{uuid}</uuid>{metadata}
  <memory unit='KiB'>{}</memory>
  <vcpu>1</vcpu>
  <memoryBacking>{backing}</memoryBacking>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <cpu mode='host-passthrough'><feature policy='disable' name='arch-capabilities'/></cpu>
  <devices>
    <emulator>{}</emulator>
    <video><model type='none'/></video>
    <memballoon model='none'/>
  </devices>
</domain>
",
            size >> 10,
            self.qemu.display()
        )
    }

    /// Points the hook at the daemon, or (`cold`) at no daemon with a cold fallback.
    pub(super) fn set_cold(&self, cold: bool) -> Result<()> {
        write_config(
            &self.config_path,
            if cold { &self.cold } else { &self.served },
        )
    }

    /// The directory for domain XML files.
    pub(super) fn xml_dir(&self) -> &Path {
        &self.xml_dir
    }

    pub(super) fn virsh_ok(&self, args: &[&str]) -> Result<()> {
        let out = self.sandbox.virsh(args)?;
        if out.status.success() {
            return Ok(());
        }
        Err(VmStartBenchError::Virsh {
            command: format!("virsh {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

impl Starter for LibvirtStarter {
    fn vmm(&self) -> Vmm {
        self.vmm
    }

    fn cases(&self) -> &'static [Case] {
        if self.vmm == Vmm::LibvirtRoot {
            &Case::ROOT
        } else {
            &Case::ALL
        }
    }

    fn start(&mut self, world: &World, case: Case, _tag: &str) -> Result<f64> {
        self.next_uuid += 1;
        let uuid = format!("7a11b007-0000-4000-8000-{:012x}", self.next_uuid);
        let file = self.xml_dir.join("domain.xml");
        std::fs::write(&file, self.domain_xml(world, case, &uuid)).map_err(|source| {
            VmStartBenchError::Io {
                op: "write the domain XML",
                source,
            }
        })?;
        let file = file.to_string_lossy().into_owned();
        // The hook reads its configuration on every call.
        let config = if case == Case::Floor {
            &self.cold
        } else {
            &self.served
        };
        write_config(&self.config_path, config)?;
        let start = Instant::now();
        self.virsh_ok(&["create", "--paused", &file])?;
        let seconds = start.elapsed().as_secs_f64();
        // `release end` gives the hook's lease back before destroy returns.
        self.virsh_ok(&["destroy", &uuid])?;
        Ok(seconds)
    }
}
