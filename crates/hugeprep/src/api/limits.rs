//! Bounds on connections, so no client can hold the daemon's descriptors: a header timeout
//! and an idle timeout per connection, a maximum of open connections per listener and per
//! peer (uid on the unix socket, address over TLS) and of TLS handshakes in flight.
//!
//! What a client over a limit sees (see `docs/api.md`, "Limits"):
//! - unix socket, too many connections: `503` with `Retry-After` and `Connection: close`,
//!   written at once without reading the request;
//! - TLS, too many connections (in total, or from one address): the TCP connection is
//!   closed before the handshake (nothing can be said in HTTP before it); too many
//!   handshakes in flight: the connection waits for a place, and is closed if it has not
//!   finished its handshake [`Limits::handshake_timeout`] after it was accepted;
//! - a connection that has not sent a complete request header within
//!   [`Limits::header_timeout`] of the daemon starting to wait for one (at connect, and after
//!   each answer on a keep-alive connection) is closed: hyper's header read timeout;
//! - a connection with no byte either way for [`Limits::idle_timeout`] while no handler runs
//!   for it (a stalled body, an answer the client does not read) is asked to close and
//!   dropped [`Limits::header_timeout`] later.
//!
//! Root on the unix socket (the libvirt hook, operators) has a reserve of connections that
//! the other peers cannot take, and no per-uid cap. Refusals are logged once per burst (at
//! most every [`LOG_EVERY`], with the count since the last line).

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Display;
use std::hash::Hash;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};

use super::error::RETRY_AFTER_S;
use super::peer::Peer;

/// The shortest interval between two log lines about refused connections.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Descriptors kept for the daemon itself (pool files, journal, pidfds of leases, scans).
const OWN_FDS: u64 = 256;

/// The limits in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open unix socket connections.
    pub unix_connections: usize,
    /// Open unix socket connections of one uid other than root.
    pub unix_per_uid: usize,
    /// Connections only root may use once the others have taken theirs.
    pub unix_root_reserve: usize,
    /// Open TLS connections (handshaken or not).
    pub tls_connections: usize,
    /// Open TLS connections from one address (a control plane opens many at once).
    pub tls_per_addr: usize,
    /// TLS handshakes in flight.
    pub tls_handshakes: usize,
    /// TLS handshakes in flight from one address.
    pub tls_handshakes_per_addr: usize,
    /// Time a client has to send a complete request header.
    pub header_timeout: Duration,
    /// Time a connection may stay without traffic.
    pub idle_timeout: Duration,
    /// Time a client has to finish the TLS handshake.
    pub handshake_timeout: Duration,
}

impl Limits {
    /// Limits that fit `nofile` descriptors: [`OWN_FDS`] for the daemon, half the rest for
    /// connections (unix 50%, TLS 35%, handshakes 15%), within fixed floors and ceilings.
    pub fn for_fd_budget(nofile: u64) -> Limits {
        let budget = nofile.saturating_sub(OWN_FDS) / 2;
        let share = |pct: u64, lo: usize, hi: usize| ((budget * pct / 100) as usize).clamp(lo, hi);
        let unix = share(50, 16, 1024);
        let tls = share(35, 8, 512);
        let handshakes = share(15, 4, 128);
        Limits {
            unix_connections: unix,
            unix_per_uid: (unix / 4).max(4),
            unix_root_reserve: (unix / 8).max(2),
            tls_connections: tls,
            tls_per_addr: (tls / 2).max(2),
            tls_handshakes: handshakes,
            tls_handshakes_per_addr: (handshakes / 4).max(1),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(10),
        }
    }

    /// The limits for this process's `RLIMIT_NOFILE` (the soft limit).
    pub fn for_process() -> Limits {
        let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        Limits::for_fd_budget(nofile)
    }
}

/// Counts what is open per key and in total; refuses past the limits.
#[derive(Debug)]
pub struct Gate<K: Hash + Eq> {
    what: &'static str,
    total_max: usize,
    per_key_max: usize,
    reserve: usize,
    open: Mutex<(usize, HashMap<K, usize>)>,
    refused: AtomicU64,
    last_log: Mutex<Option<Instant>>,
}

/// A place taken in a [`Gate`]; given back when dropped.
#[derive(Debug)]
pub struct Ticket<K: Hash + Eq + Clone> {
    gate: Arc<Gate<K>>,
    key: K,
}

impl<K: Hash + Eq + Clone + Display> Gate<K> {
    /// A gate for `what` (in logs): `total_max` open at once, `per_key_max` per key;
    /// `reserve` of the total only privileged keys may take.
    pub fn new(
        what: &'static str,
        total_max: usize,
        per_key_max: usize,
        reserve: usize,
    ) -> Arc<Self> {
        Arc::new(Gate {
            what,
            total_max,
            per_key_max,
            reserve: reserve.min(total_max.saturating_sub(1)),
            open: Mutex::new((0, HashMap::new())),
            refused: AtomicU64::new(0),
            last_log: Mutex::new(None),
        })
    }

    /// Takes a place for `key`, or says which limit is reached (and logs it once a burst).
    pub fn enter(self: &Arc<Self>, key: K, privileged: bool) -> Option<Ticket<K>> {
        match self.take(key.clone(), privileged) {
            Ok(t) => Some(t),
            Err(why) => {
                self.note_refusal(&key, &why);
                None
            }
        }
    }

    /// Takes a place for `key`, or says which limit is reached; logs nothing.
    pub fn take(self: &Arc<Self>, key: K, privileged: bool) -> Result<Ticket<K>, String> {
        let refused = {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            let (total, per_key) = &mut *open;
            let mine = per_key.get(&key).copied().unwrap_or(0);
            let total_cap = if privileged {
                self.total_max
            } else {
                self.total_max - self.reserve
            };
            if *total >= total_cap {
                Some(format!("{} open (the limit)", *total))
            } else if !privileged && mine >= self.per_key_max {
                Some(format!("{mine} open for {key} (the limit per peer)"))
            } else {
                *total += 1;
                *per_key.entry(key.clone()).or_insert(0) += 1;
                None
            }
        };
        match refused {
            None => Ok(Ticket {
                gate: Arc::clone(self),
                key,
            }),
            Some(why) => Err(why),
        }
    }

    /// Logs a refusal (or another event of the gate's burst): at most one line every
    /// [`LOG_EVERY`], with the count since the last.
    pub fn note_refusal(&self, key: &K, why: &str) {
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last_log.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(*last, Some(t) if t.elapsed() < LOG_EVERY) {
            *last = Some(Instant::now());
            self.refused.store(0, Ordering::Relaxed);
            tracing::warn!(
                what = self.what,
                peer = %key,
                refused = n,
                limit = self.total_max,
                per_peer = self.per_key_max,
                "{} refused: {why}; {n} refused since the last line",
                self.what
            );
        }
    }

    /// How many places are taken.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}

impl<K: Hash + Eq + Clone> Drop for Ticket<K> {
    fn drop(&mut self) {
        let mut open = self.gate.open.lock().unwrap_or_else(|p| p.into_inner());
        let (total, per_key) = &mut *open;
        *total = total.saturating_sub(1);
        if let Some(n) = per_key.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                per_key.remove(&self.key);
            }
        }
    }
}

/// The key of a TLS peer: its address.
pub type AddrGate = Gate<IpAddr>;

/// A stream that notes the time of its last read or write, for the idle timeout.
struct Watched<S> {
    inner: S,
    base: Instant,
    last_ms: Arc<AtomicU64>,
}

impl<S> Watched<S> {
    fn touch(&self) {
        self.last_ms
            .store(self.base.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Waits until `stop` says true.
async fn stopped(mut stop: watch::Receiver<bool>) {
    // An error is the sender gone, which means stopping too.
    let _ = stop.wait_for(|s| *s).await;
}

/// Serves one connection with the header and idle timeouts; on `stop` finishes the request
/// in progress and closes.
pub async fn serve_connection<S>(
    io: S,
    peer: Peer,
    app: Router,
    limits: Limits,
    stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let base = Instant::now();
    let last_ms = Arc::new(AtomicU64::new(0));
    // Requests whose handler runs (a large cold lease may fault for a minute without a byte
    // on the wire): the connection is not idle meanwhile.
    let in_handler = Arc::new(AtomicU64::new(0));
    let io = Watched {
        inner: io,
        base,
        last_ms: Arc::clone(&last_ms),
    };
    let busy = Arc::clone(&in_handler);
    let service =
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer.clone()));
            let app = app.clone();
            let busy = Arc::clone(&busy);
            busy.fetch_add(1, Ordering::Relaxed);
            async move {
                use tower::ServiceExt;
                let answer = app.oneshot(req.map(axum::body::Body::new)).await;
                busy.fetch_sub(1, Ordering::Relaxed);
                Ok::<_, Infallible>(match answer {
                    Ok(r) => r,
                    Err(never) => match never {},
                })
            }
        });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut tick = tokio::time::interval(Duration::from_secs(1).min(limits.idle_timeout));
    let stop = stopped(stop);
    tokio::pin!(stop);
    let mut closing = false;
    // An idle connection asked to close gets this long to finish; then it is dropped (a
    // client that stopped reading its answer would hold it forever).
    let mut drop_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(err) = r {
                    tracing::debug!(%err, "connection closed");
                }
                return;
            }
            () = &mut stop, if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            () = sleep_until_some(drop_at), if drop_at.is_some() => {
                tracing::debug!("idle connection dropped");
                return;
            }
            _ = tick.tick(), if !closing => {
                if in_handler.load(Ordering::Relaxed) > 0 {
                    last_ms.store(base.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
                let idle = base.elapsed().saturating_sub(Duration::from_millis(last_ms.load(Ordering::Relaxed)));
                if idle >= limits.idle_timeout {
                    tracing::debug!(idle_s = idle.as_secs(), "idle connection closed");
                    closing = true;
                    drop_at = Some(tokio::time::Instant::now() + limits.header_timeout);
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// What a unix socket client over the limit reads before the daemon closes.
fn busy_response() -> Vec<u8> {
    unavailable_response("too many connections to the daemon")
}

/// A 503 with `Retry-After`, closing the connection, for `why`.
fn unavailable_response(why: &str) -> Vec<u8> {
    let body = format!("{{\"error\":\"{why}; retry after {RETRY_AFTER_S} s\"}}");
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nretry-after: {RETRY_AFTER_S}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The connections a listener serves: each runs in its own task holding a token, and
/// [`Connections::finished`] waits until every token is dropped. The unix socket and the TLS
/// listener both serve through it, so a stop waits for the same things on both.
pub(super) struct Connections {
    app: Router,
    limits: Limits,
    stop: watch::Receiver<bool>,
    done_tx: Option<mpsc::Sender<()>>,
    done_rx: mpsc::Receiver<()>,
}

impl Connections {
    /// No connection yet.
    pub(super) fn new(app: Router, limits: Limits, stop: watch::Receiver<bool>) -> Connections {
        let (done_tx, done_rx) = mpsc::channel::<()>(1);
        Connections {
            app,
            limits,
            stop,
            done_tx: Some(done_tx),
            done_rx,
        }
    }

    /// Serves `stream` in a task of its own; `ticket` (its place under the listener's
    /// limits) is dropped when the connection ends.
    pub(super) fn serve<S, T>(&self, stream: S, peer: Peer, ticket: T)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        T: Send + 'static,
    {
        let Some(done) = self.done_tx.clone() else {
            // Only after `finished` began, which consumes `self`: cannot happen.
            return;
        };
        let (app, limits, stop) = (self.app.clone(), self.limits, self.stop.clone());
        tokio::spawn(async move {
            serve_connection(stream, peer, app, limits, stop).await;
            drop(ticket);
            drop(done);
        });
    }

    /// Waits until `stop` says true: when the listener stops accepting.
    pub(super) async fn stopping(&self) {
        stopped(self.stop.clone()).await;
    }

    /// Takes no more connections; returns once every connection served has ended.
    pub(super) async fn finished(&mut self) {
        drop(self.done_tx.take());
        // `None` once every connection's sender is dropped: what this waits for.
        let _ = self.done_rx.recv().await;
    }
}

/// Serves the unix socket until `stop`, each connection through the gate; then waits for
/// the connections to finish. A connection that arrives meanwhile is answered 503 with
/// `Retry-After`, unless the socket is systemd's (`activated`): then it stays queued on the
/// socket, which systemd keeps listening, and the next daemon (a restart, an upgrade)
/// serves it, so a client that does not retry sees no failure.
pub async fn serve_unix(
    listener: UnixListener,
    activated: bool,
    app: Router,
    limits: Limits,
    gate: Arc<Gate<u32>>,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut conns = Connections::new(app, limits, stop);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = conns.stopping() => break,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(err) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(%err, "unix accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let peer = Peer::of_unix(&stream);
        let (uid, privileged) = match &peer {
            Peer::Unix(Some(p)) => (p.principal_uid(), p.uid == 0),
            _ => (u32::MAX, false),
        };
        let Some(ticket) = gate.enter(uid, privileged) else {
            // A few hundred bytes fit any socket buffer: never blocks. A client that has gone
            // needs no answer.
            let _ = stream.try_write(&busy_response());
            continue;
        };
        conns.serve(stream, peer, ticket);
    }
    if activated {
        // systemd holds the listening socket too: what queues now is the next daemon's.
        conns.finished().await;
        return Ok(());
    }
    // Until the connections in flight are done the socket stays bound: a client that comes
    // now is told to retry (the daemon is stopping, most often for a restart) instead of
    // waiting in the backlog for a close.
    let finished = conns.finished();
    tokio::pin!(finished);
    loop {
        tokio::select! {
            () = &mut finished => break,
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    tracing::info!("answered 503 with retry-after {RETRY_AFTER_S} s: shutting down");
                    tokio::spawn(answer_shutting_down(stream));
                }
            }
        }
    }
    Ok(())
}

/// Answers 503 and reads what the client sends until it closes (at most 1 s), so that its
/// request is written whole and it reads the answer rather than a broken pipe.
async fn answer_shutting_down(mut stream: tokio::net::UnixStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A client gone already needs no answer; the drain below ends at once then.
    let _ = stream
        .write_all(&unavailable_response("the daemon is shutting down"))
        .await;
    let mut sink = [0u8; 4096];
    let drain = async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} };
    // Drained or timed out, the connection is closed the same way.
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_fit_the_default_descriptor_limit() {
        let l = Limits::for_fd_budget(1024);
        assert!(
            (l.unix_connections + l.tls_connections + l.tls_handshakes) as u64 + OWN_FDS < 1024,
            "{l:?}"
        );
        let big = Limits::for_fd_budget(1 << 20);
        assert_eq!(big.unix_connections, 1024);
    }

    #[test]
    fn a_peer_cannot_take_the_others_places_nor_root_reserve() {
        let gate = Gate::<u32>::new("test", 8, 4, 2);
        let mine: Vec<_> = (0..4).map(|_| gate.enter(1000, false).unwrap()).collect();
        assert!(gate.enter(1000, false).is_none(), "per-uid limit");
        let other: Vec<_> = (0..2).map(|_| gate.enter(1001, false).unwrap()).collect();
        assert!(gate.enter(1002, false).is_none(), "root's reserve");
        let root: Vec<_> = (0..2).map(|_| gate.enter(0, true).unwrap()).collect();
        assert!(gate.enter(0, true).is_none(), "the total");
        drop(mine);
        assert!(gate.enter(1000, false).is_some());
        assert_eq!(gate.open(), 4);
        drop((other, root));
    }
}
