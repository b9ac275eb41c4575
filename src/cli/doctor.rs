//! `hugeprep doctor`: check this host for hugeprep and say what to do about each finding.
//! Exit status: 0 healthy, 3 warnings (VMs start, degraded), 4 something blocks VM starts
//! (1 and 2 keep their meaning for every command: an error, a usage error).

use std::path::{Path, PathBuf};

use hugeprep::daemon::config::ConfigFile;
use hugeprep::doctor::{self, DoctorOptions};
use hugeprep::pool::PoolPolicy;

/// The configuration file read when `--config` is not given and it exists.
const DEFAULT_CONFIG: &str = "/etc/hugeprep/hugeprep.toml";

/// Check hugepage pools, mounts, kernel features, limits, CPU, the daemon, QEMU, libvirt and
/// systemd; print each finding with what to do. Exit status 0: healthy, 3: warnings (VMs
/// start, degraded), 4: something blocks VM starts; 1: the check itself failed.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// The daemon's configuration file (its reserve settings and targets); default
    /// /etc/hugeprep/hugeprep.toml when it exists.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Daemon socket.
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// libvirt's configuration directory (qemu.conf, hooks/).
    #[arg(long, default_value = "/etc/libvirt")]
    pub libvirt_dir: PathBuf,
    /// The libvirt hook's configuration.
    #[arg(long, default_value = hugeprep::vmm::libvirt::DEFAULT_CONFIG)]
    pub hook_config: PathBuf,
    /// Do not probe for a 1 GiB page (the probe adds one to the pool and takes it back).
    #[arg(long)]
    pub no_probe: bool,
}

/// Runs `hugeprep doctor`; exits 3 or 4 when it found warnings or blocking problems.
pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(p) => ConfigFile::load(p)?,
        None if Path::new(DEFAULT_CONFIG).exists() => ConfigFile::load(Path::new(DEFAULT_CONFIG))?,
        None => ConfigFile::default(),
    };
    let policy = match &config.pool {
        Some(spec) => spec.validate()?,
        None => PoolPolicy::embedded(),
    };
    let mut page_sizes: Vec<_> = policy.targets.iter().map(|t| t.page_size).collect();
    if page_sizes.is_empty() {
        page_sizes.push(hugeprep::PageSize::Size2M);
    }
    page_sizes.sort();
    page_sizes.dedup();
    let opts = DoctorOptions {
        socket: config
            .socket
            .clone()
            .filter(|_| args.socket.as_os_str() == hugeprep::client::DEFAULT_SOCKET)
            .unwrap_or(args.socket),
        reserve: policy.reserve,
        page_sizes,
        clearing_policy: config.clearing_policy,
        libvirt_dir: args.libvirt_dir,
        hook_config: args.hook_config,
        run_dir: config
            .run_dir
            .clone()
            .unwrap_or_else(|| hugeprep::daemon::DEFAULT_RUN_DIR.into()),
        probe_1g: !args.no_probe,
    };
    let report = doctor::run(&opts);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", doctor::render(&report));
    }
    let code = report.exit_code();
    if code != 0 {
        std::process::exit(i32::from(code));
    }
    Ok(())
}
