//! `hugeprep status`: the daemon's leases and warm pool.

use std::path::PathBuf;

use hugeprep::client::Client;
use hugeprep::pool::PoolStatus;
use hugeprep::units::format_bytes;

/// Show the daemon's leases and pool.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Only the warm pool table (or JSON), no leases.
    #[arg(long)]
    pub pool: bool,
    /// Daemon socket.
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

fn print_pool(pool: &PoolStatus) {
    println!(
        "{:>4} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}  mount",
        "node", "page", "target", "warm", "leased", "dirty", "scrubbing", "filling", "kernel free"
    );
    for k in &pool.kinds {
        println!(
            "{:>4} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}  {}",
            k.node,
            k.page_size,
            format_bytes(k.target_bytes),
            format_bytes(k.warm_bytes),
            format_bytes(k.leased_bytes),
            format_bytes(k.dirty_bytes),
            format_bytes(k.scrubbing_bytes),
            format_bytes(k.filling_bytes),
            format_bytes(k.kernel_free_pages * k.page_size.bytes()),
            k.mount.display()
        );
    }
}

/// Runs `hugeprep status`.
pub fn run(args: StatusArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.socket);
    if args.pool {
        let pool = client.blocking(client.pool())?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&pool)?);
        } else {
            print_pool(&pool);
        }
        return Ok(());
    }
    let leases = client.blocking(client.leases())?;
    let pool = client.blocking(client.pool())?;
    let cpu = client.blocking(client.cpu())?;
    if args.json {
        let all = serde_json::json!({"leases": leases, "pool": pool, "cpu": cpu});
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    println!("clearing: {} ({})", cpu.method, cpu.rule);
    print_pool(&pool);
    println!();
    super::lease::print_leases(&leases);
    Ok(())
}
