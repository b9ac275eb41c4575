//! The man pages of the configuration files, hugeprep.toml(5) and libvirt-hook.toml(5),
//! generated from the annotated files the packages install as the defaults
//! (`service/hugeprep.toml`, `policies/pool.toml` for `[pool]`,
//! `integration/libvirt/libvirt-hook.toml`): each key, commented out or set, with the comment
//! above it, per table, and the whole default file as the example. A key documented in the
//! default file is in the page; `tests/config_pages.rs` checks that every key the parsers
//! accept is documented there, and that every documented key parses, so the pages cannot
//! drift from the defaults or the code.

use std::fmt::Write as _;

/// `service/hugeprep.toml`, installed as `/etc/hugeprep/hugeprep.toml`.
pub const HUGEPREP_TOML: &str = include_str!("../../../../service/hugeprep.toml");
/// `policies/pool.toml`: the keys of `[pool]`.
pub const POOL_TOML: &str = include_str!("../../../../policies/pool.toml");
/// `integration/libvirt/libvirt-hook.toml`, installed as `/etc/hugeprep/libvirt-hook.toml`.
pub const HOOK_TOML: &str = include_str!("../../../../integration/libvirt/libvirt-hook.toml");

/// Keys documented together (one comment paragraph), in a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The table (`""` for the top level, `pool`, `[pool.target]` for an array of tables).
    pub table: String,
    /// `key = value` lines as written (without the comment mark).
    pub keys: Vec<String>,
    /// The comment above them.
    pub doc: String,
}

impl Group {
    /// The key names of the group.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.keys
            .iter()
            .filter_map(|k| k.split_once('=').map(|(n, _)| n.trim()))
    }
}

/// A table header (`[pool]`, `# [[pool.target]]`) in a line without its comment mark.
fn header(line: &str) -> Option<String> {
    let l = line.split(" #").next()?.trim();
    if l.starts_with("[[") && l.ends_with("]]") {
        Some(format!("[{}]", &l[2..l.len() - 2]))
    } else if l.starts_with('[') && l.ends_with(']') {
        Some(l[1..l.len() - 1].to_string())
    } else {
        None
    }
}

/// A `key = value` line without its comment mark.
fn key_line(line: &str) -> Option<String> {
    let (name, _) = line.split_once('=')?;
    let name = name.trim();
    (!name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
    .then(|| line.trim().to_string())
}

/// The file's header comment (up to the first blank line) and its groups; `prefix` names
/// the table the file's top level is in (`pool` for policies/pool.toml).
pub fn parse(text: &str, prefix: &str) -> (String, Vec<Group>) {
    let join = |table: &str| -> String {
        match (prefix, table) {
            ("", t) => t.to_string(),
            (p, "") => p.to_string(),
            (p, t) if t.starts_with('[') => format!("[{p}.{}", &t[1..]),
            (p, t) => format!("{p}.{t}"),
        }
    };
    let mut lines = text.lines().peekable();
    let mut intro = Vec::new();
    while let Some(l) = lines.next_if(|l| !l.trim().is_empty()) {
        intro.push(l.trim_start_matches('#').trim().to_string());
    }
    let mut groups: Vec<Group> = Vec::new();
    let mut table = String::new();
    let mut doc: Vec<String> = Vec::new();
    let mut open = false;
    for raw in lines {
        let line = raw.trim();
        if line.is_empty() {
            doc.clear();
            open = false;
            continue;
        }
        let body = line.trim_start_matches('#').trim();
        if let Some(t) = header(body) {
            table = t;
            open = false;
            if !doc.is_empty() {
                groups.push(Group {
                    table: join(&table),
                    keys: Vec::new(),
                    doc: doc.join(" "),
                });
                doc.clear();
            }
            continue;
        }
        if let Some(k) = key_line(body) {
            match groups.last_mut() {
                Some(g) if open => g.keys.push(k),
                _ => {
                    groups.push(Group {
                        table: join(&table),
                        keys: vec![k],
                        doc: doc.join(" "),
                    });
                    open = true;
                }
            }
            continue;
        }
        if open {
            // A comment after keys starts the next group's paragraph.
            open = false;
            doc.clear();
        }
        doc.push(body.to_string());
    }
    (intro.join(" "), groups)
}

fn roff(text: &str) -> String {
    let t = text.replace('\\', "\\e").replace('-', "\\-");
    // A line that starts with a dot or quote would be a request.
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

fn page(
    name: &str,
    summary: &str,
    intro: &str,
    sections: &[(String, Vec<Group>)],
    examples: &[(&str, &str)],
    see_also: &str,
) -> String {
    let mut out = String::new();
    let write = |out: &mut String| -> std::fmt::Result {
        writeln!(
            out,
            ".TH {} 5 \"\" \"hugeprep {}\" \"File Formats\"",
            name.to_uppercase(),
            env!("CARGO_PKG_VERSION")
        )?;
        writeln!(out, ".SH NAME\n{} \\- {}", roff(name), roff(summary))?;
        writeln!(out, ".SH SYNOPSIS\n/etc/hugeprep/{}", roff(name))?;
        writeln!(out, ".SH DESCRIPTION\n{}", roff(intro))?;
        for (title, groups) in sections {
            writeln!(out, ".SH {}", roff(title))?;
            for g in groups {
                if g.keys.is_empty() {
                    writeln!(out, ".PP\n{}", roff(&g.doc))?;
                    continue;
                }
                writeln!(out, ".TP")?;
                for (i, k) in g.keys.iter().enumerate() {
                    if i > 0 {
                        writeln!(out, ".TQ")?;
                    }
                    writeln!(out, "\\fB{}\\fR", roff(k))?;
                }
                writeln!(
                    out,
                    "{}",
                    roff(if g.doc.is_empty() {
                        "(see the example)"
                    } else {
                        &g.doc
                    })
                )?;
            }
        }
        for (title, text) in examples {
            writeln!(out, ".SH {}\n.nf", roff(title))?;
            for l in text.lines() {
                writeln!(out, "{}", roff(l))?;
            }
            writeln!(out, ".fi")?;
        }
        writeln!(out, ".SH SEE ALSO\n{}", roff(see_also))?;
        Ok(())
    };
    write(&mut out).expect("writing to a String cannot fail");
    out
}

/// Sections by table: the top level first, then each table in the order met.
fn by_table(groups: Vec<Group>) -> Vec<(String, Vec<Group>)> {
    let mut out: Vec<(String, Vec<Group>)> = Vec::new();
    for g in groups {
        let title = if g.table.is_empty() {
            "KEYS".to_string()
        } else {
            format!("[{}]", g.table)
        };
        match out.iter_mut().find(|(t, _)| *t == title) {
            Some((_, v)) => v.push(g),
            None => out.push((title, vec![g])),
        }
    }
    out
}

/// Every group of hugeprep.toml: its own, with `[pool]` from policies/pool.toml.
pub fn hugeprep_groups() -> Vec<Group> {
    let (_, own) = parse(HUGEPREP_TOML, "");
    let (_, pool) = parse(POOL_TOML, "pool");
    let mut groups: Vec<Group> = own.into_iter().filter(|g| g.table != "pool").collect();
    let at = groups
        .iter()
        .position(|g| !g.table.is_empty())
        .unwrap_or(groups.len());
    groups.splice(at..at, pool);
    groups
}

/// hugeprep.toml(5), roff.
pub fn hugeprep_toml() -> String {
    let (intro, _) = parse(HUGEPREP_TOML, "");
    let (pool_intro, _) = parse(POOL_TOML, "pool");
    page(
        "hugeprep.toml",
        "configuration of the hugeprep daemon",
        &format!("{intro} [pool]: {pool_intro}"),
        &by_table(hugeprep_groups()),
        &[
            ("DEFAULT FILE", HUGEPREP_TOML),
            ("DEFAULT POOL POLICY (policies/pool.toml)", POOL_TOML),
        ],
        "hugeprep(1), hugeprep-serve(1), libvirt-hook.toml(5); /usr/share/doc/hugeprep/operations.md, openstack.md",
    )
}

/// Every group of libvirt-hook.toml.
pub fn hook_groups() -> Vec<Group> {
    parse(HOOK_TOML, "").1
}

/// libvirt-hook.toml(5), roff.
pub fn libvirt_hook_toml() -> String {
    let (intro, _) = parse(HOOK_TOML, "");
    page(
        "libvirt-hook.toml",
        "settings of hugeprep's libvirt hook",
        &intro,
        &by_table(hook_groups()),
        &[("DEFAULT FILE", HOOK_TOML)],
        "hugeprep-libvirt-hook(1), hugeprep.toml(5); /usr/share/doc/hugeprep/libvirt.md",
    )
}

/// The two pages: file name and roff text.
pub fn pages() -> [(&'static str, String); 2] {
    [
        ("hugeprep.toml.5", hugeprep_toml()),
        ("libvirt-hook.toml.5", libvirt_hook_toml()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_take_the_comment_above_them_and_their_table() {
        let text = "# intro\n# more\n\n# The socket.\n# socket = \"/s\"\n# group = \"kvm\"\n\n\
                    [pool]\n# How to verify.\nverify = \"sample\"\n\n# [[pool.target]]\n# warm = \"1G\"\n";
        let (intro, groups) = parse(text, "");
        assert_eq!(intro, "intro more");
        assert_eq!(groups[0].doc, "The socket.");
        assert_eq!(groups[0].names().collect::<Vec<_>>(), ["socket", "group"]);
        assert_eq!(
            (groups[1].table.as_str(), groups[1].doc.as_str()),
            ("pool", "How to verify.")
        );
        assert_eq!(groups[2].table, "[pool.target]");
        let (_, nested) = parse("# intro\n\n# [[target]]\n# warm = \"1G\"\n", "pool");
        assert_eq!(nested[0].table, "[pool.target]");
        assert!(hugeprep_toml().contains(".SH [pool]"));
    }
}
