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
//!
//! An entry too large for one datagram (journald's socket takes about 200 KiB) is written to
//! a sealed memfd whose descriptor is sent instead, as `sd_journal_sendv` does: no entry is
//! dropped for its size.
//!
//! Why not the `tracing-journald` crate, which does the same transport: it puts only the
//! event's message in `MESSAGE` (the fields go to their own journal fields only), so the
//! short `journalctl` view and `journalctl -g name=vm1` would lose every field that
//! operators grep for today (docs/operations.md); it also maps INFO to priority 5 (notice)
//! and prefixes every field with `F_` unless configured otherwise. This layer is the
//! message format on top of the same two sends (`send_entry`).

use std::fmt::Write as _;
use std::io::Write as _;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;

use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};
use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

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

/// Sends one entry: as a datagram, or, when it is too large for one (`EMSGSIZE`, `ENOBUFS`),
/// as a sealed memfd passed with `SCM_RIGHTS` (journald reads the entry from it).
pub fn send_entry(socket: &UnixDatagram, entry: &[u8]) -> std::io::Result<()> {
    match socket.send(entry) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMSGSIZE | libc::ENOBUFS)) => {
            send_memfd(socket, entry)
        }
        Err(e) => Err(e),
    }
}

fn send_memfd(socket: &UnixDatagram, entry: &[u8]) -> std::io::Result<()> {
    let fd = memfd_create(
        "hugeprep-journal-entry",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let mut file = std::fs::File::from(fd);
    file.write_all(entry)?;
    // journald takes only a sealed memfd: nobody can change the entry after it is sent.
    fcntl_add_seals(
        &file,
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE | SealFlags::SEAL,
    )?;
    let fds = [file.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(std::io::Error::other("no room for the descriptor"));
    }
    sendmsg(socket, &[], &mut control, SendFlags::empty())?;
    Ok(())
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
            // Writing to a String cannot fail.
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
            // Writing to a String cannot fail.
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
        // A log line that journald refuses (journald restarting, no memory for the memfd) is
        // lost rather than blocking the daemon; a short line says so, if it can.
        if send_entry(&self.socket, &entry).is_err() {
            let mut short = Vec::new();
            let meta = event.metadata();
            append_field(&mut short, "MESSAGE", "(a log line journald refused)");
            append_field(&mut short, "PRIORITY", &priority(meta.level()).to_string());
            append_field(&mut short, "SYSLOG_IDENTIFIER", "hugeprep");
            // Refused too: there is nowhere left to say so, and logging must not block.
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

    #[test]
    fn an_entry_larger_than_a_datagram_goes_as_a_sealed_memfd() {
        use std::os::unix::fs::FileExt;
        let (tx, rx) = UnixDatagram::pair().unwrap();
        let mut entry = Vec::new();
        append_field(&mut entry, "MESSAGE", &"x".repeat(1 << 20));
        assert!(
            tx.send(&entry).is_err(),
            "a datagram this large must not fit"
        );
        send_entry(&tx, &entry).unwrap();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
        let mut payload = [0u8; 16];
        let got = rustix::net::recvmsg(
            &rx,
            &mut [std::io::IoSliceMut::new(&mut payload)],
            &mut control,
            rustix::net::RecvFlags::empty(),
        )
        .unwrap();
        assert_eq!(got.bytes, 0, "the datagram carries only the descriptor");
        let fd = control
            .drain()
            .find_map(|m| match m {
                rustix::net::RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
                _ => None,
            })
            .expect("a descriptor");
        let seals = rustix::fs::fcntl_get_seals(&fd).unwrap();
        assert!(seals.contains(SealFlags::WRITE | SealFlags::SHRINK | SealFlags::SEAL));
        let file = std::fs::File::from(fd);
        let mut read = vec![0u8; entry.len()];
        file.read_exact_at(&mut read, 0).unwrap();
        assert_eq!(read, entry);
        // A small entry is still one datagram.
        send_entry(&tx, b"MESSAGE=short\n").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"MESSAGE=short\n");
    }
}
