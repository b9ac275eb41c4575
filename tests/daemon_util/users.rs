//! Unprivileged principals on the daemon's socket: `curl` run through `setpriv` as a uid with
//! one group and no other, as a packaged QEMU or a tenant's VMM would call it.

use std::process::Command;

use super::Env;

/// The socket's group in these tests: Debian's `kvm`, the group libvirt runs QEMU in.
pub fn kvm_gid() -> u32 {
    nix::unistd::Group::from_name("kvm")
        .unwrap()
        .expect("group kvm (qemu-system-x86 makes it)")
        .gid
        .as_raw()
}

/// `curl` on the daemon's socket as `uid` with primary group `gid` and no other group:
/// (status, body).
pub fn curl_as(
    uid: u32,
    gid: u32,
    env: &Env,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        &format!("--reuid={uid}"),
        &format!("--regid={gid}"),
        "--clear-groups",
        "--",
        "curl",
        "-s",
        "--max-time",
        "60",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "-X",
        method,
        "--unix-socket",
    ])
    .arg(&env.socket)
    .args(["-H", "Content-Type: application/json"]);
    if !body.is_empty() {
        cmd.args(["-d", body]);
    }
    let out = cmd
        .arg(format!("http://localhost{path}"))
        .output()
        .expect("setpriv and curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// [`curl_as`] as `uid` in group `kvm`, the body read as JSON (a string when it is not).
pub fn curl_json_as(
    uid: u32,
    env: &Env,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let (code, body) = curl_as(uid, kvm_gid(), env, method, path, body);
    let json = serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body));
    (code, json)
}
