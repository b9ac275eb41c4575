//! hugeprep.toml(5) and libvirt-hook.toml(5) cannot drift: they are generated from the default
//! files the packages install (`hugeprep::daemon::config_page`), every key the parsers accept
//! is documented in those files (so in the pages), every key documented there parses, and the
//! pages `hugeprep manpages` writes render with man(1).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use hugeprep::daemon::config::{ConfigFile, MetricsSpec};
use hugeprep::daemon::config_page::{self, Group};
use serde::de::DeserializeOwned;

/// The keys `T` accepts in the table that `prefix` opens, from the parser's own refusal of
/// an unknown key ("unknown field `x`, expected one of `a`, `b`").
fn accepted<T: DeserializeOwned + std::fmt::Debug>(prefix: &str) -> BTreeSet<String> {
    let err = toml::from_str::<T>(&format!("{prefix}zzz_unknown = 1\n"))
        .unwrap_err()
        .to_string();
    let expected = err
        .split_once("expected")
        .unwrap_or_else(|| panic!("{prefix}: {err}"))
        .1;
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn documented(groups: &[Group]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for g in groups {
        let table = g.table.trim_matches(|c| c == '[' || c == ']').to_string();
        out.entry(table.clone())
            .or_default()
            .extend(g.names().map(str::to_string));
        // A table documents its own name in its parent, and so on up (`[pool.limits.role.lease]`
        // documents `limits` in `[pool]`).
        let mut t = table.as_str();
        while !t.is_empty() {
            let (parent, name) = t.rsplit_once('.').unwrap_or(("", t));
            out.entry(parent.to_string())
                .or_default()
                .insert(name.trim_matches('"').to_string());
            t = parent;
        }
    }
    out
}

fn check(table: &str, accepted: BTreeSet<String>, documented: &BTreeMap<String, BTreeSet<String>>) {
    let doc = documented.get(table).cloned().unwrap_or_default();
    let missing: Vec<&String> = accepted.difference(&doc).collect();
    assert!(
        missing.is_empty(),
        "[{table}] accepts {missing:?}, which the default file does not document (and so neither does the man page)"
    );
}

/// The file with every commented-out key and table header set.
fn uncommented(text: &str) -> String {
    text.lines()
        .map(|l| {
            let body = l.trim_start_matches('#').trim();
            let is_key = body.split_once('=').is_some_and(|(n, _)| {
                let n = n.trim();
                !n.is_empty()
                    && n.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            });
            let is_table =
                body.starts_with('[') && body.split(" #").next().unwrap().trim_end().ends_with(']');
            if l.starts_with('#') && (is_key || is_table) {
                body.to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_key_the_parsers_accept_is_in_the_pages() {
    let doc = documented(&config_page::hugeprep_groups());
    check("", accepted::<ConfigFile>(""), &doc);
    check("pool", accepted::<ConfigFile>("[pool]\n"), &doc);
    check(
        "pool.target",
        accepted::<ConfigFile>("[[pool.target]]\npage_size = \"2M\"\n"),
        &doc,
    );
    check(
        "pool.limits.role.lease",
        accepted::<ConfigFile>("[pool.limits.role.lease]\n"),
        &doc,
    );
    check("access", accepted::<ConfigFile>("[access]\n"), &doc);
    check(
        "access.unix_peer",
        accepted::<ConfigFile>("[[access.unix_peer]]\n"),
        &doc,
    );
    check("metrics", accepted::<MetricsSpec>(""), &doc);
    check("placement", accepted::<ConfigFile>("[placement]\n"), &doc);
    let hook = documented(&config_page::hook_groups());
    check(
        "",
        accepted::<hugeprep::vmm::libvirt::config::HookConfig>(""),
        &hook,
    );
}

#[test]
fn every_key_the_pages_document_parses() {
    let text = uncommented(config_page::HUGEPREP_TOML);
    toml::from_str::<ConfigFile>(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let text = uncommented(config_page::POOL_TOML);
    toml::from_str::<hugeprep::policy::pool::PoolPolicySpec>(&text)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let text = uncommented(config_page::HOOK_TOML);
    toml::from_str::<hugeprep::vmm::libvirt::config::HookConfig>(&text)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
}

#[test]
fn manpages_writes_the_pages_and_man_renders_them() {
    let dir = std::env::temp_dir().join(format!("hugeprep-config-pages-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .arg("manpages")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (name, text) in config_page::pages() {
        assert_eq!(
            std::fs::read_to_string(dir.join(name)).unwrap(),
            text,
            "{name}"
        );
        let Ok(out) = Command::new("man")
            .env("MANWIDTH", "100")
            .env("MAN_KEEP_FORMATTING", "0")
            .args(["--warnings", "-l"])
            .arg(dir.join(name))
            .output()
        else {
            hugeprep::testing::missing_tool("man (Debian package man-db)");
            continue;
        };
        // man without a terminal still overstrikes bold ("N\x08N"): keep the last of each.
        let mut shown = String::new();
        for c in String::from_utf8_lossy(&out.stdout).chars() {
            if c == '\x08' {
                shown.pop();
            } else {
                shown.push(c);
            }
        }
        let shown = shown.replace("\x08", "");
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).trim().is_empty(),
            "{name}: warnings: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(shown.contains("DEFAULT FILE"), "{shown}");
    }
    let shown = std::fs::read_to_string(dir.join("hugeprep.toml.5")).unwrap();
    for key in [
        "scrub_bandwidth",
        "min_interval_ms",
        "tls_client_ca",
        "listen",
    ] {
        assert!(shown.contains(key), "{key}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every command's page has EXIT STATUS, FILES (but the generators') and SEE ALSO, and man
/// renders each without a warning; doctor's names its own statuses 3 and 4.
#[test]
fn every_command_page_has_exit_status_files_and_see_also() {
    let dir = std::env::temp_dir().join(format!("hugeprep-man-sections-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_hugeprep"))
        .arg("manpages")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut pages = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".1") {
            continue;
        }
        pages += 1;
        let roff = std::fs::read_to_string(&path).unwrap();
        assert!(roff.contains(".SH \"EXIT STATUS\""), "{name}");
        assert!(roff.contains(".SH \"SEE ALSO\""), "{name}");
        if !name.contains("completions") && !name.contains("manpages") {
            assert!(roff.contains(".SH FILES"), "{name}");
        }
        let exit = roff.find("EXIT STATUS").unwrap();
        if let Some(version) = roff.find(".SH VERSION") {
            assert!(exit < version, "{name}: the sections go before VERSION");
        }
        let Ok(out) = Command::new("man")
            .env("MANWIDTH", "100")
            .args(["--warnings", "-l"])
            .arg(&path)
            .output()
        else {
            hugeprep::testing::missing_tool("man (Debian package man-db)");
            continue;
        };
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stderr).trim().is_empty(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if name == "hugeprep-doctor.1" {
            // man without a terminal overstrikes bold ("N\x08N"): keep the last of each.
            let mut shown = String::new();
            for c in String::from_utf8_lossy(&out.stdout).chars() {
                if c == '\x08' {
                    shown.pop();
                } else {
                    shown.push(c);
                }
            }
            assert!(shown.contains("EXIT STATUS"), "{shown}");
            assert!(shown.contains("degraded: warnings"), "{shown}");
            assert!(shown.contains("blocked:"), "{shown}");
        }
    }
    assert!(pages > 20, "{pages} pages");
    std::fs::remove_dir_all(&dir).unwrap();
}
