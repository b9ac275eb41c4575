//! The `hugeprep` command: parses arguments, calls the library, maps errors to exit codes.

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    cli::init_tracing(args.verbose);
    match cli::run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hugeprep: {}", cli::render_error(&err));
            std::process::ExitCode::FAILURE
        }
    }
}
