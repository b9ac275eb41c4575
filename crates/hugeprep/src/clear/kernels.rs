//! The clearing kernels: the only inline assembly in hugeprep.
//!
//! A [`Kernel`] can only be made by [`Kernel::detect`], which checks the running CPU, so
//! holding one proves that its instructions exist; [`zero`] is therefore safe to call on any
//! `&mut [u8]`.
//!
//! Non-temporal kernels (MOVNTI, AVX2 and AVX-512 `vmovntdq`, CLZERO) store whole, aligned
//! cache lines only. The unaligned head up to the first line boundary and the tail after the
//! last whole line are cleared with ordinary cached stores, so no line is written partly
//! cached and partly streamed. The body is streamed in slices of the plan's fence interval
//! with one `sfence` after each slice: fencing every 4 KiB instead costs two thirds of the
//! bandwidth on Zen 4, while one fence per 64 KiB or more costs nothing measurable.

use super::Method;

/// Cache line size assumed for alignment of the vector and MOVNTI kernels. Streaming a whole
/// line at once lets the write-combining buffer go out as one full-line write.
const LINE: usize = 64;

/// A clearing routine the running CPU is known to support.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kernel {
    method: Method,
    /// Alignment and granule of the streamed body: one cache line (CLZERO's own line size).
    line: usize,
}

impl Kernel {
    /// `rep stosb`: the cached path for small extents, available everywhere.
    pub(crate) const REP_STOSB: Kernel = Kernel {
        method: Method::RepStosb,
        line: LINE,
    };

    /// The kernel for `method`, or `None` when this CPU lacks the instructions.
    pub(crate) fn detect(method: Method) -> Option<Kernel> {
        if !method.is_available() {
            return None;
        }
        let line = match method {
            Method::Clzero => super::detect::clzero_line_size()?,
            _ => LINE,
        };
        Some(Kernel { method, line })
    }

    /// The method this kernel implements.
    pub(crate) fn method(self) -> Method {
        self.method
    }
}

/// Zeroes `buf` with `kernel`; non-temporal kernels fence once per `fence_interval` bytes
/// (rounded up to whole lines) and once at the end. `fence_interval` must be positive.
pub(crate) fn zero(kernel: Kernel, buf: &mut [u8], fence_interval: usize) {
    if buf.is_empty() {
        return;
    }
    match kernel.method {
        // `fill(0)` lowers to the compiler's memset, exactly as `ptr::write_bytes` does.
        Method::WriteBytes => buf.fill(0),
        #[cfg(target_arch = "x86_64")]
        Method::RepStosb => x86::rep_stosb(buf),
        #[cfg(target_arch = "x86_64")]
        _ => stream(kernel, buf, fence_interval),
        #[cfg(not(target_arch = "x86_64"))]
        _ => {
            // Only the x86-64 non-temporal kernels fence; the parameter is unused here.
            let _ = fence_interval;
            buf.fill(0)
        }
    }
}

/// Head with cached stores, line-aligned body streamed slice by slice, tail cached.
#[cfg(target_arch = "x86_64")]
fn stream(kernel: Kernel, buf: &mut [u8], fence_interval: usize) {
    let line = kernel.line;
    let head_len = buf.as_ptr().align_offset(line).min(buf.len());
    let (head, rest) = buf.split_at_mut(head_len);
    head.fill(0);
    let body_len = rest.len() / line * line;
    let (body, tail) = rest.split_at_mut(body_len);
    let slice_len = fence_interval.max(1).div_ceil(line) * line;
    for slice in body.chunks_mut(slice_len) {
        let (ptr, len) = (slice.as_mut_ptr(), slice.len());
        // SAFETY: `slice` is a live, exclusively borrowed region of `len` bytes; `ptr` is
        // aligned to `line` because `body` starts on a line boundary and every slice before
        // this one is a whole number of lines; `len` is a positive multiple of `line`
        // (`chunks_mut` yields no empty slice and `body_len` is whole lines); and `kernel`
        // came from `Kernel::detect`, so the CPU has the instructions and, for CLZERO,
        // `line` is the size CLZERO zeroes.
        unsafe {
            match kernel.method {
                Method::Movnti => x86::movnti_lines(ptr, len),
                Method::Avx2Nt => x86::avx2_nt_lines(ptr, len),
                Method::Avx512Nt => x86::avx512_nt_lines(ptr, len),
                Method::Clzero => x86::clzero_lines(ptr, len, line),
                Method::RepStosb | Method::WriteBytes => {
                    unreachable!("cached kernels are not streamed")
                }
            }
        }
        x86::sfence();
    }
    tail.fill(0);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;

    /// `rep stosb` over the whole slice in one instruction: on ERMS/FSRM CPUs it switches to
    /// streaming stores by itself above about the LLC size. Fast-string stores may be
    /// weakly ordered among themselves, so an `sfence` follows.
    pub(super) fn rep_stosb(buf: &mut [u8]) {
        // SAFETY: `rep stosb` writes exactly `rcx` bytes of `al` from `rdi` upwards (the
        // direction flag is clear per the ABI); `rdi`/`rcx` describe the exclusively borrowed
        // `buf`. Flags and the stack are untouched.
        unsafe {
            asm!(
                "rep stosb",
                inout("rdi") buf.as_mut_ptr() => _,
                inout("rcx") buf.len() => _,
                in("al") 0u8,
                options(nostack, preserves_flags),
            );
        }
        sfence();
    }

    /// Orders every earlier non-temporal store before every later store.
    pub(super) fn sfence() {
        // SAFETY: `sfence` (SSE, every x86-64) only orders stores; it touches no register,
        // flag or memory location.
        unsafe { asm!("sfence", options(nostack, preserves_flags)) };
    }

    /// Streams zeroes with MOVNTI, eight 8-byte stores per line.
    ///
    /// # Safety
    /// `ptr` must be 64-byte aligned and valid for writes of `len` bytes, a positive
    /// multiple of 64, that nothing else accesses meanwhile.
    pub(super) unsafe fn movnti_lines(ptr: *mut u8, len: usize) {
        // SAFETY: the loop writes the `len` bytes from `ptr` the caller vouches for, one
        // line per iteration, and stops when `len` reaches zero (it is a positive multiple
        // of 64, so the `jnz` terminates exactly at the end). MOVNTI is SSE2, part of the
        // x86-64 baseline.
        unsafe {
            asm!(
                "2:",
                "movnti qword ptr [{p}], {z}",
                "movnti qword ptr [{p} + 8], {z}",
                "movnti qword ptr [{p} + 16], {z}",
                "movnti qword ptr [{p} + 24], {z}",
                "movnti qword ptr [{p} + 32], {z}",
                "movnti qword ptr [{p} + 40], {z}",
                "movnti qword ptr [{p} + 48], {z}",
                "movnti qword ptr [{p} + 56], {z}",
                "add {p}, 64",
                "sub {n}, 64",
                "jnz 2b",
                p = inout(reg) ptr => _,
                n = inout(reg) len => _,
                z = in(reg) 0u64,
                options(nostack),
            );
        }
    }

    /// Streams zeroes with 32-byte `vmovntdq`, two per line.
    ///
    /// # Safety
    /// As for [`movnti_lines`], and the CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn avx2_nt_lines(ptr: *mut u8, len: usize) {
        // SAFETY: as in `movnti_lines`; the stores are 32-byte aligned because `ptr` is
        // 64-byte aligned, as `vmovntdq` requires. `clobber_abi("C")` tells the compiler
        // that every vector register, and the upper halves `vzeroupper` clears, are lost.
        unsafe {
            asm!(
                "vpxor ymm0, ymm0, ymm0",
                "2:",
                "vmovntdq ymmword ptr [rdi], ymm0",
                "vmovntdq ymmword ptr [rdi + 32], ymm0",
                "add rdi, 64",
                "sub rcx, 64",
                "jnz 2b",
                "vzeroupper",
                inout("rdi") ptr => _,
                inout("rcx") len => _,
                clobber_abi("C"),
                options(nostack),
            );
        }
    }

    /// Streams zeroes with 64-byte `vmovntdq`, one per line.
    ///
    /// # Safety
    /// As for [`movnti_lines`], and the CPU (and the kernel's XSAVE state) must support
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512_nt_lines(ptr: *mut u8, len: usize) {
        // SAFETY: as in `avx2_nt_lines`, with 64-byte stores on 64-byte aligned lines.
        unsafe {
            asm!(
                "vpxord zmm0, zmm0, zmm0",
                "2:",
                "vmovntdq zmmword ptr [rdi], zmm0",
                "add rdi, 64",
                "sub rcx, 64",
                "jnz 2b",
                "vzeroupper",
                inout("rdi") ptr => _,
                inout("rcx") len => _,
                clobber_abi("C"),
                options(nostack),
            );
        }
    }

    /// Zeroes whole cache lines with AMD's CLZERO, which writes a line without reading it.
    ///
    /// # Safety
    /// The CPU must support CLZERO with lines of exactly `line` bytes; `ptr` must be aligned
    /// to `line` and valid for writes of `len` bytes, a positive multiple of `line`, that
    /// nothing else accesses meanwhile.
    pub(super) unsafe fn clzero_lines(ptr: *mut u8, len: usize, line: usize) {
        // SAFETY: CLZERO zeroes the `line`-byte line holding `rax`; `rax` walks the aligned
        // lines of the caller's region and the loop stops when `len` reaches zero.
        unsafe {
            asm!(
                "2:",
                "clzero rax",
                "add rax, {line}",
                "sub {n}, {line}",
                "jnz 2b",
                inout("rax") ptr => _,
                n = inout(reg) len => _,
                line = in(reg) line,
                options(nostack),
            );
        }
    }
}
