//! Criterion benchmark of every clearing method this CPU offers on a 64 MiB buffer (twice
//! the LLC of a Zen 4 CCD), hugepage-backed when free 2M pages exist. For the full matrix of
//! chunk sizes, thread counts and the kernel baseline, run `hugeprep bench clear`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hugeprep::clear::{available_methods, Clearer};
use hugeprep::sys::mmap::MmapRegion;
use hugeprep::{ClearPlan, PageSize};

const LEN: usize = 64 << 20;

fn methods(c: &mut Criterion) {
    let mut region = MmapRegion::anonymous(LEN, Some(PageSize::Size2M))
        .or_else(|_| MmapRegion::anonymous(LEN, None))
        .expect("map a 64 MiB buffer");
    // First touch is far slower than any method: fault and clear once before timing.
    let _ = region.populate_write(0, LEN);
    region.as_mut_slice().fill(0);

    let mut group = c.benchmark_group("clear_64MiB");
    group.throughput(Throughput::Bytes(LEN as u64));
    group.sample_size(20);
    for method in available_methods() {
        let clearer = Clearer::new(ClearPlan::always(method)).expect("available method");
        group.bench_function(method.name(), |b| {
            b.iter(|| clearer.clear(region.as_mut_slice()))
        });
    }
    group.finish();
}

criterion_group!(benches, methods);
criterion_main!(benches);
