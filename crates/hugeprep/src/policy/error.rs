//! Policy errors, and turning byte offsets in a policy file into a line, a column and the
//! name of the field there.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// A policy file that cannot be read or is not valid.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("cannot read policy file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// The file is not valid TOML, has an unknown or missing field, or a value is out of range.
    #[error("{}", Located { path, line: *line, column: *column, field: field.as_deref(), message })]
    Invalid {
        /// The file (for the embedded policy: `policies/clearing.toml`).
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column, in characters.
        column: usize,
        /// The field, as a path: `calibration`, `defaults.fence_interval`, `rule[3].method`
        /// (rules are numbered from 1 in file order). `None` when the error is not inside a
        /// field, e.g. a stray character between tables.
        field: Option<String>,
        /// What is wrong, and what is allowed.
        message: String,
    },
}

impl PolicyError {
    /// The field the error is about, if it is about one.
    pub fn field(&self) -> Option<&str> {
        match self {
            PolicyError::Invalid { field, .. } => field.as_deref(),
            PolicyError::Read { .. } => None,
        }
    }

    /// The 1-based line the error is on, if it is about the file's content.
    pub fn line(&self) -> Option<usize> {
        match self {
            PolicyError::Invalid { line, .. } => Some(*line),
            PolicyError::Read { .. } => None,
        }
    }
}

struct Located<'a> {
    path: &'a Path,
    line: usize,
    column: usize,
    field: Option<&'a str>,
    message: &'a str,
}

impl fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.path.display(), self.line, self.column)?;
        if let Some(field) = self.field {
            write!(f, "field `{field}`: ")?;
        }
        f.write_str(self.message)
    }
}

/// A policy file's text and name, to locate errors in it.
pub(super) struct Document<'a> {
    pub text: &'a str,
    pub path: &'a Path,
}

impl Document<'_> {
    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_column(&self, offset: usize) -> (usize, usize) {
        let offset = floor_char_boundary(self.text, offset);
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        (line, column)
    }

    /// An error about `field` at byte `offset`.
    pub fn error(
        &self,
        offset: usize,
        field: Option<String>,
        message: impl Into<String>,
    ) -> PolicyError {
        let (line, column) = self.line_column(offset);
        PolicyError::Invalid {
            path: self.path.to_path_buf(),
            line,
            column,
            field,
            message: message.into(),
        }
    }

    /// Converts a TOML syntax or deserialization error, naming the field at its location.
    pub fn toml_error(&self, err: &toml::de::Error) -> PolicyError {
        let offset = err.span().map_or(0, |s| s.start);
        let message = err
            .message()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(": ");
        let field = self.field_at(offset, &message);
        self.error(offset, field, message)
    }

    /// The field path at `offset`: the enclosing table (`rule[N]` for the N-th `[[rule]]`,
    /// from 1) and the key whose value contains the offset. serde names the key itself in
    /// "unknown field" and "missing field" messages; otherwise the nearest `key =` at or
    /// before the offset (values such as arrays can span lines) is the field.
    fn field_at(&self, offset: usize, message: &str) -> Option<String> {
        let offset = floor_char_boundary(self.text, offset);
        let line_start = self.text[..offset].rfind('\n').map_or(0, |i| i + 1);
        let line_end = self.text[offset..]
            .find('\n')
            .map_or(self.text.len(), |i| offset + i);
        // An error on a table header is either about that table (a field missing from it)
        // or about the header's own key (an unknown table): then the enclosing table is
        // the header's dotted prefix, not the table before it.
        let header = table_header(&self.text[line_start..line_end]);
        let mut table: Option<String> = None;
        match header {
            Some(name) if !message.starts_with("missing field") => {
                table = name.rsplit_once('.').map(|(parent, _)| parent.to_string());
            }
            _ => {
                let mut rules = 0;
                for line in self.text[..line_end].lines() {
                    if let Some(name) = table_header(line) {
                        table = Some(if name == "rule" {
                            rules += 1;
                            format!("rule[{rules}]")
                        } else {
                            name.to_string()
                        });
                    }
                }
            }
        }
        let named = ["unknown field `", "missing field `"]
            .iter()
            .find_map(|prefix| message.strip_prefix(prefix))
            .and_then(|rest| rest.split('`').next())
            .map(str::to_string);
        let key = named.or_else(|| match header {
            Some(name) => Some(name.rsplit('.').next().unwrap_or(name).to_string()),
            None => self.key_before(offset),
        });
        match (table, key) {
            (Some(t), Some(k)) => Some(format!("{t}.{k}")),
            (None, Some(k)) => Some(k),
            (Some(t), None) => Some(t),
            (None, None) => None,
        }
    }

    fn key_before(&self, offset: usize) -> Option<String> {
        let line_start = self.text[..offset].rfind('\n').map_or(0, |i| i + 1);
        let current = &self.text[line_start..offset];
        if let Some(key) = assignment_key(current) {
            return Some(key);
        }
        for line in self.text[..line_start].lines().rev() {
            if table_header(line).is_some() {
                return None;
            }
            if let Some(key) = assignment_key(line) {
                return Some(key);
            }
        }
        None
    }
}

/// `rule` for `[[rule]]`, `defaults` for `[defaults]`; `None` for any other line, including
/// the continuation lines of a multi-line array such as `[0x60, 0x7f],`.
fn table_header(line: &str) -> Option<&str> {
    let t = line.split('#').next()?.trim();
    let inner = t
        .strip_prefix("[[")
        .and_then(|r| r.strip_suffix("]]"))
        .or_else(|| t.strip_prefix('[').and_then(|r| r.strip_suffix(']')))?
        .trim();
    let is_key = !inner.is_empty()
        && inner
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !inner.chars().all(|c| c.is_ascii_digit());
    is_key.then_some(inner)
}

/// `method` for `  method = "x"`.
fn assignment_key(line: &str) -> Option<String> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"').trim_matches('\'');
    let valid = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    valid.then(|| key.to_string())
}

fn floor_char_boundary(text: &str, offset: usize) -> usize {
    let mut i = offset.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> Document<'_> {
        Document {
            text,
            path: Path::new("p.toml"),
        }
    }

    #[test]
    fn line_and_column_count_characters() {
        let d = doc("a = 1\nbé = 2\n");
        assert_eq!(d.line_column(0), (1, 1));
        assert_eq!(d.line_column(6), (2, 1));
        assert_eq!(d.line_column(10), (2, 4));
    }

    #[test]
    fn field_in_multiline_array_of_second_rule() {
        let text = "[[rule]]\nname = \"a\"\n[[rule]]\nmodel_ranges = [\n  [1, 2],\n  [3, -4],\n]\n";
        let offset = text.find("-4").unwrap();
        assert_eq!(
            doc(text).field_at(offset, "invalid value"),
            Some("rule[2].model_ranges".to_string())
        );
    }

    #[test]
    fn headers_are_not_array_rows() {
        assert_eq!(table_header("[[rule]]  # x"), Some("rule"));
        assert_eq!(table_header("[defaults]"), Some("defaults"));
        assert_eq!(table_header("  [0x10, 0x1f],"), None);
        assert_eq!(table_header("[85]"), None);
    }
}
