//! Logs to the systemd journal in its native protocol when the daemon's stderr is the journal
//! (`JOURNAL_STREAM` names stderr's device and inode, as systemd sets it for
//! `StandardError=journal`): every line carries its priority (`journalctl -p warning -u
//! hugeprep` shows warnings and errors only) and each event field as a journal field
//! (`journalctl -u hugeprep NAME=vm1`). The message keeps the fields as `key=value` text too,
//! as on a terminal, so the short `journalctl` view and `journalctl -g name=vm1` read the same.
//!
//! | tracing level | journal `PRIORITY` |
//! |---|---|
//! | ERROR | 3 (err) |
//! | WARN | 4 (warning) |
//! | INFO | 6 (info) |
//! | DEBUG, TRACE | 7 (debug) |
//!
//! Fields: `MESSAGE`, `PRIORITY`, `SYSLOG_IDENTIFIER=hugeprep`, `TARGET` (the module),
//! `CODE_FILE`, `CODE_LINE`, and each event field upper-cased (`id` -> `ID`; one that would
//! clash with these gets an `F_` prefix).

use std::fmt::Write as _;
use std::os::unix::net::UnixDatagram;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;

/// journald's native socket.
pub const SOCKET: &str = "/run/systemd/journal/socket";

/// Whether stderr is the journal: `JOURNAL_STREAM` is `DEV:INODE` of stderr.
pub fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let Ok(st) = rustix::fs::fstat(std::io::stderr()) else {
        return false;
    };
    dev.parse::<u64>().ok() == Some(st.st_dev) && ino.parse::<u64>().ok() == Some(st.st_ino)
}

/// The journal priority of a level.
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// A journal field name for an event field: upper-case letters, digits and `_`, not starting
/// with `_` or a digit, at most 64 bytes; names the layer sets itself get `F_`.
pub fn field_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    while out.starts_with('_') {
        out.remove(0);
    }
    if out.is_empty()
        || out.starts_with(|c: char| c.is_ascii_digit())
        || matches!(
            out.as_str(),
            "MESSAGE" | "PRIORITY" | "SYSLOG_IDENTIFIER" | "TARGET" | "CODE_FILE" | "CODE_LINE"
        )
    {
        out.insert_str(0, "F_");
    }
    out.truncate(64);
    out
}

/// Appends one field in the native protocol (the length-prefixed form when it has a newline).
pub fn append_field(buf: &mut Vec<u8>, name: &str, value: &str) {
    buf.extend_from_slice(name.as_bytes());
    if value.contains('\n') {
        buf.push(b'\n');
        buf.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        buf.push(b'=');
    }
    buf.extend_from_slice(value.as_bytes());
    buf.push(b'\n');
}

/// The event's message and fields: the message as a terminal shows it, the fields raw.
#[derive(Default)]
struct Collect {
    message: String,
    text_fields: String,
    fields: Vec<(String, String)>,
}

impl Visit for Collect {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.text_fields, " {}={value:?}", field.name());
            self.fields
                .push((field_name(field.name()), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message.push_str(&text);
        } else {
            let _ = write!(self.text_fields, " {}={text}", field.name());
            self.fields.push((field_name(field.name()), text));
        }
    }
}

/// The layer: one datagram per event to journald's socket.
#[derive(Debug)]
pub struct JournaldLayer {
    socket: UnixDatagram,
}

impl JournaldLayer {
    /// Connects to journald's socket.
    pub fn new() -> std::io::Result<JournaldLayer> {
        let socket = UnixDatagram::unbound()?;
        socket.connect(SOCKET)?;
        Ok(JournaldLayer { socket })
    }

    /// The datagram of one event.
    fn entry(event: &Event<'_>) -> Vec<u8> {
        let meta = event.metadata();
        let mut c = Collect::default();
        event.record(&mut c);
        let mut buf = Vec::with_capacity(256);
        append_field(
            &mut buf,
            "MESSAGE",
            &format!("{}{}", c.message, c.text_fields),
        );
        append_field(&mut buf, "PRIORITY", &priority(meta.level()).to_string());
        append_field(&mut buf, "SYSLOG_IDENTIFIER", "hugeprep");
        append_field(&mut buf, "TARGET", meta.target());
        if let Some(file) = meta.file() {
            append_field(&mut buf, "CODE_FILE", file);
        }
        if let Some(line) = meta.line() {
            append_field(&mut buf, "CODE_LINE", &line.to_string());
        }
        for (name, value) in &c.fields {
            append_field(&mut buf, name, value);
        }
        buf
    }
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for JournaldLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let entry = Self::entry(event);
        // A log line that journald refuses (too large, journald restarting) is lost rather
        // than blocking the daemon; there is nowhere else to say so.
        if self.socket.send(&entry).is_err() {
            let mut short = Vec::new();
            let meta = event.metadata();
            append_field(
                &mut short,
                "MESSAGE",
                "(a log line journald refused: too large?)",
            );
            append_field(&mut short, "PRIORITY", &priority(meta.level()).to_string());
            append_field(&mut short, "SYSLOG_IDENTIFIER", "hugeprep");
            let _ = self.socket.send(&short);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_follow_the_native_protocol() {
        assert_eq!(field_name("id"), "ID");
        assert_eq!(field_name("ready_ms"), "READY_MS");
        assert_eq!(field_name("message"), "F_MESSAGE");
        assert_eq!(field_name("_hidden"), "HIDDEN");
        assert_eq!(field_name("1st"), "F_1ST");
        assert_eq!(field_name("a.b"), "A_B");
        let mut buf = Vec::new();
        append_field(&mut buf, "A", "one line");
        append_field(&mut buf, "B", "two\nlines");
        let mut want = b"A=one line\nB\n".to_vec();
        want.extend_from_slice(&9u64.to_le_bytes());
        want.extend_from_slice(b"two\nlines\n");
        assert_eq!(buf, want);
        assert_eq!(priority(&Level::WARN), 4);
        assert_eq!(priority(&Level::INFO), 6);
    }
}
