//! Proving scrubbed memory clean: every byte, or sampled cache lines of every page.

use crate::policy::pool::Verification;

/// A small xorshift generator: verification samples need spread, not secrecy.
struct XorShift(u64);

impl XorShift {
    fn seeded() -> XorShift {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9, |d| d.as_nanos() as u64);
        XorShift(t | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// 4 KiB of zeroes to compare against: slice equality is `memcmp`, fast in every build.
static ZERO_BLOCK: [u8; 4096] = [0; 4096];

/// The first non-zero byte of `buf`, as (offset, value).
pub fn first_nonzero(buf: &[u8]) -> Option<(usize, u8)> {
    let mut off = 0;
    for block in buf.chunks(ZERO_BLOCK.len()) {
        if block != &ZERO_BLOCK[..block.len()] {
            let i = block.iter().position(|&b| b != 0).unwrap_or(0);
            return Some((off + i, block[i]));
        }
        off += block.len();
    }
    None
}

/// Checks `buf` (the part of a file starting at `base`) per `level`; `page` is the page size
/// in bytes.
pub fn verify(buf: &[u8], base: u64, page: usize, level: Verification) -> Result<(), (u64, u8)> {
    match level {
        Verification::Full => match first_nonzero(buf) {
            Some((off, value)) => Err((base + off as u64, value)),
            None => Ok(()),
        },
        Verification::Sample => {
            let mut rng = XorShift::seeded();
            let lines_per_page = (page / 64).max(1);
            // 1 GiB pages hold 512 times the lines of a 2 MiB page: sample more of them.
            let samples = if page > (2 << 20) { 256 } else { 16 };
            let mut picks = Vec::with_capacity(samples + 2);
            for (p, page_buf) in buf.chunks(page).enumerate() {
                let lines = page_buf.len().div_ceil(64);
                picks.clear();
                picks.extend(
                    (0..samples)
                        .map(|_| (rng.next() % lines_per_page as u64) as usize)
                        .chain([0, lines.saturating_sub(1)])
                        .map(|line| {
                            let start = (line * 64).min(page_buf.len().saturating_sub(1));
                            start..(start + 64).min(page_buf.len())
                        }),
                );
                // The sampled lines were just written with streaming stores, so every read
                // misses the cache: OR them together without a branch per line, so that the
                // CPU keeps many misses in flight (a compare per line waited for each one
                // in turn: 0.75 ms per GiB, 6% of a one-thread scrub). Only a page that
                // shows a non-zero byte is searched for its offset.
                let any = picks.iter().fold(0u8, |acc, r| {
                    page_buf[r.clone()].iter().fold(acc, |a, &b| a | b)
                });
                if any != 0 {
                    for r in &picks {
                        if let Some((off, value)) = first_nonzero(&page_buf[r.clone()]) {
                            return Err((base + (p * page + r.start + off) as u64, value));
                        }
                    }
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verification_finds_a_dirty_byte() {
        let mut buf = vec![0u8; 4 << 20];
        assert!(verify(&buf, 0, 2 << 20, Verification::Full).is_ok());
        assert!(verify(&buf, 0, 2 << 20, Verification::Sample).is_ok());
        buf[3 << 20 | 77] = 9;
        assert_eq!(
            verify(&buf, 100, 2 << 20, Verification::Full),
            Err((100 + (3 << 20 | 77), 9))
        );
        // Sampling always checks each page's last line.
        buf[(4 << 20) - 1] = 5;
        // The offset and value of the byte found (the earlier dirty byte only when a random
        // sample happens to hit its line).
        let found = verify(&buf, 10, 2 << 20, Verification::Sample).unwrap_err();
        assert!(
            found == (10 + (4 << 20) - 1, 5) || found == (10 + (3 << 20 | 77), 9),
            "{found:?}"
        );
    }
}
