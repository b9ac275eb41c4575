//! `hugeprep release`: give a lease back to the daemon.

use std::path::PathBuf;

use hugeprep::client::Client;

/// Release a lease: its memory is scrubbed and returns to the pool (or is freed).
#[derive(Debug, clap::Args)]
pub struct ReleaseArgs {
    /// Lease id (from `hugeprep lease` or `hugeprep status`), or its name.
    pub lease: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Daemon socket.
    #[arg(long, env = "HUGEPREP_SOCKET", default_value = hugeprep::client::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// Runs `hugeprep release`.
pub fn run(args: ReleaseArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.socket);
    let id = match args.lease.parse::<u64>() {
        Ok(id) => id,
        Err(_) => super::qemu_args::find_lease(&client, &args.lease)?.id,
    };
    let lease = client.blocking(client.release(id))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&lease)?);
    } else {
        println!("released {} ({})", lease.id, lease.name);
    }
    Ok(())
}
