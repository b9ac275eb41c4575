//! `hugeprep status`: the daemon's leases and warm pool.

use std::path::PathBuf;

use hugeprep::clear::Calibration;
use hugeprep::client::Client;

/// Show the daemon's leases and pool.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Daemon socket.
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// Runs `hugeprep status`.
pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.socket);
    let leases = client.blocking(client.leases())?;
    let pool = client.blocking(client.pool())?;
    let cpu = client.blocking(client.cpu())?;
    if args.json {
        let all = serde_json::json!({"leases": leases, "pool": pool, "cpu": cpu});
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    println!(
        "clearing: {} (rule {}, decided by {}{})",
        cpu.method,
        cpu.rule,
        format!("{:?}", cpu.decided_by).to_lowercase(),
        calibrated_on(&cpu).map_or(String::new(), |m| format!(", calibrated on {m}"))
    );
    print!("{}", super::pool::render_daemon_table(&pool));
    println!();
    super::lease::print_leases(&leases);
    Ok(())
}

/// Which memory the daemon's calibration was timed on, from `/v1/cpu`'s `calibration.measured`.
fn calibrated_on(cpu: &hugeprep::api::CpuReport) -> Option<String> {
    let measured = cpu.calibration.as_ref()?.get("measured")?;
    let calibration: Calibration = serde_json::from_value(measured.clone()).ok()?;
    Some(calibration.describe_memory())
}
