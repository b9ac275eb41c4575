//! `hugeprep bench clear`: clearing methods x chunk sizes x thread counts against the
//! kernel's fault-in of fresh hugepages.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::Context;
use hugeprep::hugetlb::lock::HugepageLock;
use hugeprep::units::parse_bytes;
use hugeprep::Method;
use hugeprep_bench::clear::{self, BenchProgress, ClearBenchConfig, PolicyChoice};

/// Times every clearing method this CPU offers at chunk sizes from 4 KiB to 1 GiB and 1 to
/// N pinned threads, next to the kernel's own zeroing of fresh 2M and 1G hugepages.
#[derive(Debug, clap::Args)]
pub struct BenchClearArgs {
    /// Fewer chunk sizes, a 512 MiB buffer and 5 repetitions: done in well under a minute.
    #[arg(long)]
    quick: bool,
    /// Methods to time, comma-separated (default: every method this CPU offers).
    #[arg(long, value_delimiter = ',')]
    methods: Vec<Method>,
    /// Thread counts, comma-separated (default: 1 to the number of CPUs allowed).
    #[arg(long, value_delimiter = ',')]
    threads: Vec<usize>,
    /// Chunk sizes (bytes per kernel call), comma-separated, e.g. 4K,2M,1G.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    chunks: Vec<usize>,
    /// Bytes cleared per repetition, a multiple of 2M (default 1G, 512M with --quick).
    #[arg(long, value_parser = parse_size)]
    buffer: Option<usize>,
    /// Timed repetitions per measurement after one warm-up (at least 5).
    #[arg(long)]
    reps: Option<usize>,
    /// Write a chart (GB/s against chunk size, at the largest thread count) to FILE as SVG.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// `--json`, `--json-out FILE`.
    #[command(flatten)]
    output: super::JsonOutput,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let bytes = parse_bytes(s).map_err(|e| e.to_string())?;
    usize::try_from(bytes).map_err(|_| format!("size {s:?} does not fit in memory"))
}

/// Runs the benchmark and prints or writes its results.
pub fn run(args: BenchClearArgs) -> anyhow::Result<()> {
    let mut config = if args.quick {
        ClearBenchConfig::quick()
    } else {
        ClearBenchConfig::full()
    };
    if !args.methods.is_empty() {
        config.methods = args.methods;
    }
    if !args.threads.is_empty() {
        config.threads = args.threads;
    }
    if !args.chunks.is_empty() {
        config.chunk_sizes = args.chunks;
    }
    if let Some(buffer) = args.buffer {
        config.buffer_bytes = buffer;
    }
    if let Some(reps) = args.reps {
        config.reps = reps;
    }
    let lock = HugepageLock::acquire()?;
    let in_use = super::clearing_in_use::decide_in_use(&lock)?;
    config.policy = Some(PolicyChoice::from_resolution(&in_use));
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}")
            .context("progress bar template")?,
    );
    let interrupted = hugeprep::sys::signals::cancel_on_signals()?;
    let report = clear::run(&config, &lock, &mut |p: &BenchProgress| {
        bar.set_length(p.total as u64);
        bar.set_position(p.done as u64);
        bar.set_message(p.label.clone());
        if interrupted.load(Ordering::Relaxed) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    bar.finish_and_clear();
    let report = report?;
    drop(lock);

    args.output.emit(&report, || report.table())?;
    if let Some(path) = &args.svg {
        std::fs::write(path, report.svg())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
