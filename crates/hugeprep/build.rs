//! Compiles the release proof's BPF program (`src/sys/bpf/reach.bpf.c`) with clang into
//! `$OUT_DIR/reach.bpf.o`, which `src/sys/reach_bpf.rs` embeds. The program is CO-RE: it is
//! relocated against the running kernel's BTF when the daemon loads it, so the build needs no
//! kernel headers of the target machine, only clang and the Linux UAPI headers
//! (Debian: `clang`, `linux-libc-dev`); libbpf's own headers come from the `libbpf-sys`
//! crate. Set `CLANG` to use another clang.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "src/sys/bpf/reach.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let obj = out.join("reach.bpf.o");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let libbpf = std::env::var("DEP_BPF_INCLUDE")
        .expect("libbpf-sys names its include directory (DEP_BPF_INCLUDE)");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    let mut cmd = Command::new(&clang);
    cmd.args(["-g", "-O2", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I{libbpf}"))
        // asm/types.h of the build machine's multiarch directory (linux-libc-dev).
        .arg(format!("-I/usr/include/{arch}-linux-gnu"))
        .arg("-c")
        .arg(src)
        .arg("-o")
        .arg(&obj);
    let status = cmd.status().unwrap_or_else(|err| {
        panic!(
            "cannot run {clang} to build the release proof's BPF program ({err}): \
             install clang (Debian: apt-get install clang linux-libc-dev), or set CLANG"
        )
    });
    assert!(
        status.success(),
        "{clang} failed to build {src} ({status}); the command was {cmd:?}"
    );
}
