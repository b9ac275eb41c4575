//! A real OpenStack Placement for the tests (`serve.py` beside this file, from the venv
//! `scripts/placement-venv` makes), and what the tests ask it, as Nova would.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::monitor_util::{http, json, wait_for, Guard};

/// The warm class of 2M pages.
pub const CLASS: &str = "CUSTOM_HUGEPREP_WARM_2M";

/// A Placement service on a loopback port, stopped on drop.
pub struct Placement {
    pub url: String,
    _server: Guard,
}

impl Placement {
    pub fn start(dir: &Path) -> Option<Placement> {
        Placement::start_with(dir, &[], "http")
    }

    /// Placement with `serve.py`'s `args`, its URL's `scheme` (`https` with `--tls`).
    pub fn start_with(dir: &Path, args: &[&str], scheme: &str) -> Option<Placement> {
        let venv = match std::env::var_os("HUGEPREP_PLACEMENT_VENV") {
            Some(v) => PathBuf::from(v),
            None => {
                let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/placement-venv");
                let out = Command::new(script).output().unwrap();
                if !out.status.success() {
                    hugeprep::testing::missing_tool(&format!(
                        "the OpenStack Placement venv (scripts/placement-venv): {}",
                        String::from_utf8_lossy(&out.stderr)
                    ));
                    return None;
                }
                PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            }
        };
        std::fs::create_dir_all(dir).unwrap();
        let log = std::fs::File::create(dir.join("placement.log")).unwrap();
        let server = Guard(
            Command::new(venv.join("bin/python"))
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/placement/serve.py"))
                .arg(dir)
                .args(args)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let port = wait_for(Duration::from_secs(60), "Placement's port", || {
            std::fs::read_to_string(dir.join("port")).ok()
        });
        Some(Placement {
            url: format!("{scheme}://127.0.0.1:{}", port.trim()),
            _server: server,
        })
    }

    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let body = body.map(|b| b.to_string());
        let a = http(
            method,
            &format!("{}{path}", self.url),
            &[
                ("x-auth-token", "admin"),
                ("openstack-api-version", "placement 1.39"),
                // Not the daemon's: check_daemon_requests tells them apart by this.
                ("user-agent", "hugeprep-tests"),
                ("content-type", "application/json"),
            ],
            body.as_deref(),
        );
        let v = if a.body.is_empty() {
            Value::Null
        } else {
            json(&a)
        };
        (a.status.as_u16(), v)
    }

    /// A compute node's provider as Nova makes it, with its memory and CPUs.
    pub fn compute_node(&self, name: &str) -> String {
        let (s, v) = self.call("POST", "/resource_providers", Some(json!({ "name": name })));
        assert_eq!(s, 200, "{v}");
        let uuid = v["uuid"].as_str().unwrap().to_string();
        let (s, v) = self.call(
            "PUT",
            &format!("/resource_providers/{uuid}/inventories"),
            Some(json!({"resource_provider_generation": 0, "inventories": {
                "VCPU": {"total": 8}, "MEMORY_MB": {"total": 65536}}})),
        );
        assert_eq!(s, 200, "{v}");
        uuid
    }

    pub fn provider(&self, name: &str) -> Option<Value> {
        let (s, v) = self.call("GET", &format!("/resource_providers?name={name}"), None);
        assert_eq!(s, 200, "{v}");
        v["resource_providers"].as_array()?.first().cloned()
    }

    /// `(total, reserved)` of the class on provider `uuid`, and its usage.
    pub fn warm(&self, uuid: &str) -> (u64, u64, u64) {
        let (_, inv) = self.call(
            "GET",
            &format!("/resource_providers/{uuid}/inventories"),
            None,
        );
        let (_, usage) = self.call("GET", &format!("/resource_providers/{uuid}/usages"), None);
        let i = &inv["inventories"][CLASS];
        (
            i["total"].as_u64().unwrap_or(0),
            i["reserved"].as_u64().unwrap_or(0),
            usage["usages"][CLASS].as_u64().unwrap_or(0),
        )
    }

    /// The class's `max_unit` on provider `uuid`.
    pub fn max_unit(&self, uuid: &str) -> Option<u64> {
        let (_, inv) = self.call(
            "GET",
            &format!("/resource_providers/{uuid}/inventories"),
            None,
        );
        inv["inventories"][CLASS]["max_unit"].as_u64()
    }

    /// The root providers (compute nodes) Placement offers for `resources`, as Nova's
    /// scheduler asks.
    pub fn candidates(&self, resources: &str) -> BTreeSet<String> {
        let (s, v) = self.call(
            "GET",
            &format!("/allocation_candidates?resources={resources}"),
            None,
        );
        assert_eq!(s, 200, "{v}");
        let summaries = &v["provider_summaries"];
        v["allocation_requests"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["allocations"].as_object().unwrap().keys().cloned())
            .map(|rp| {
                summaries[&rp]["root_provider_uuid"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }
}
