//! E1 and T15: the HTTP connections — the one module that touches client sockets. It accepts,
//! keeps each connection's phase (waiting for a head, reading a body, busy, writing an answer,
//! idle; `pcmail_core::conns`), closes the ones past their deadline and counts them
//! (`pcmail_connections_closed_total{reason}`), makes room when the server is full by closing
//! the connection waiting longest on its client, and when every slot is busy still answers
//! `/healthz` (and nothing else) on a connection of its own. HTTP/1.1 without `Host` is
//! answered 400 here, before any route (T19). On shutdown it stops accepting, lets busy
//! connections finish their answer, and returns when all are closed.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::metrics::ClosedConnections;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::{Request, Response, StatusCode, Version, header};
use axum::response::IntoResponse;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use pcmail_core::conns::{Closed, Phase, Timeouts, deadline, evictee};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tower::ServiceExt;

/// Connections served beyond the limit, one answer each, so `/healthz` answers when every
/// slot is busy; past these a new connection is closed at once.
const OVERFLOW: usize = 32;
/// A read buffer is grown at most to this: request heads are small, bodies stream through.
const MAX_BUF: usize = 64 * 1024;
/// How often a connection whose answer is all handed to the socket asks the kernel whether
/// the client has taken it (T15: bytes the client never acknowledged are not taken).
const TAKEN_CHECK: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Connections served at once (already bounded by the file descriptors the process has).
    pub limit: usize,
    pub timeouts: Timeouts,
}

/// One connection's shared state: its phase, a wake-up when the phase changes, and the order
/// to close.
struct Conn {
    phase: Mutex<Phase>,
    changed: Notify,
    close: Notify,
    /// The answer's body has been handed to hyper to its end (what is left is in the socket).
    answered: AtomicBool,
    /// The socket, to ask how much of the answer the client has not acknowledged yet.
    fd: Option<i32>,
}

impl Conn {
    fn new(now: u64, fd: Option<i32>) -> Arc<Conn> {
        Arc::new(Conn {
            phase: Mutex::new(Phase::Head { since: now }),
            changed: Notify::new(),
            close: Notify::new(),
            answered: AtomicBool::new(false),
            fd,
        })
    }

    /// Moves from one phase to the next only if `from` accepts the current one: the body and
    /// answer wrappers report late (a body dropped after its answer) and must not undo a move.
    fn shift(&self, from: impl FnOnce(Phase) -> Option<Phase>) {
        let mut phase = self.phase.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(next) = from(*phase) {
            *phase = next;
            drop(phase);
            self.changed.notify_one();
        }
    }

    /// The answer is taken when hyper has all of it and the client acknowledged every byte:
    /// then the connection is idle.
    fn check_taken(&self, now: u64) {
        if self.answered.load(Ordering::Acquire) && unacknowledged(self.fd) == 0 {
            self.shift(|p| matches!(p, Phase::Write { .. }).then_some(Phase::Idle { since: now }));
        }
    }

    /// Before closing a connection whose client did not take its answer: the kernel is told
    /// to reset it rather than keep the unsent bytes (an orphaned socket would hold them for
    /// minutes behind a closed window, T15's memory in the kernel's buffers instead of ours).
    fn drop_unsent(&self) {
        if matches!(self.phase(), Phase::Write { .. }) && unacknowledged(self.fd) > 0 {
            reset_on_close(self.fd);
        }
    }

    fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, next: Phase) {
        *self.phase.lock().unwrap_or_else(PoisonError::into_inner) = next;
        self.changed.notify_one();
    }

    /// Bytes arrived: an idle connection starts its next request's head now.
    fn bytes_arrived(&self, now: u64) {
        let mut phase = self.phase.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*phase, Phase::Idle { .. }) {
            *phase = Phase::Head { since: now };
            drop(phase);
            self.changed.notify_one();
        }
    }
}

struct Shared {
    router: Router,
    settings: Settings,
    /// `pcmail_connections_closed_total{reason}`.
    closed: ClosedConnections,
    /// O1: HTTPS when set; the handshake counts against the header timeout.
    tls: Option<tokio_rustls::TlsAcceptor>,
    epoch: Instant,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    overflow: AtomicUsize,
    /// The last warning about a full server (ms since `epoch`), so a flood logs once in a while.
    warned_at: AtomicU64,
}

impl Shared {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn warn_full(&self, message: &str) {
        let now = self.now();
        let last = self.warned_at.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= 10_000)
            && self.warned_at.compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            tracing::warn!(limit = self.settings.limit, "{message}");
        }
    }

    /// Registers a new connection, closing the longest-waiting idle one if the server is full.
    /// None: every slot is busy (serve it as an overflow connection).
    fn admit(&self, fd: Option<i32>) -> Option<(u64, Arc<Conn>)> {
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        if conns.len() >= self.settings.limit {
            let victim = evictee(conns.iter().map(|(id, c)| (*id, c.phase())))?;
            if let Some(c) = conns.remove(&victim) {
                c.close.notify_one();
            }
            self.warn_full("connection limit reached: closing the connection waiting longest on its client");
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Conn::new(self.now(), fd);
        conns.insert(id, conn.clone());
        Some((id, conn))
    }

    fn count(&self, reason: Closed) {
        self.closed.count(reason);
    }

    fn forget(&self, id: u64) {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
    }

    /// Frees a file descriptor when accept found none: closes the longest-waiting idle one.
    fn shed(&self) {
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(victim) = evictee(conns.iter().map(|(id, c)| (*id, c.phase())))
            && let Some(c) = conns.remove(&victim)
        {
            c.close.notify_one();
        }
    }
}

/// Serves `router` on `listener` until `shutdown` turns true, then drains; every connection
/// closed for a reason of [`Closed`] is counted in `closed`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    (settings, closed): (Settings, ClosedConnections),
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    let shared = Arc::new(Shared {
        router,
        settings,
        closed,
        tls,
        epoch: Instant::now(),
        conns: Mutex::default(),
        next_id: AtomicU64::new(0),
        overflow: AtomicUsize::new(0),
        warned_at: AtomicU64::new(0),
    });
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|stop| *stop) => break,
        };
        let (stream, addr) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors (or another passing failure): make room, breathe, go on.
                shared.warn_full(&format!("cannot accept a connection ({e}); closing the connection idle the longest"));
                shared.shed();
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match shared.admit(raw_fd(&stream)) {
            Some((id, conn)) => {
                tasks.spawn(connection(shared.clone(), stream, addr, Some((id, conn)), shutdown.clone()));
            }
            None if shared.overflow.load(Ordering::Relaxed) < OVERFLOW => {
                shared.warn_full("connection limit reached and every connection is busy: answering /healthz only");
                shared.overflow.fetch_add(1, Ordering::Relaxed);
                tasks.spawn(connection(shared.clone(), stream, addr, None, shutdown.clone()));
            }
            None => drop(stream),
        }
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

/// One connection to its end. `slot` is None for an overflow connection: one answer, and only
/// `/healthz` is served.
async fn connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    addr: SocketAddr,
    slot: Option<(u64, Arc<Conn>)>,
    shutdown: watch::Receiver<bool>,
) {
    let overflow = slot.is_none();
    let (id, conn) = slot.unwrap_or_else(|| (u64::MAX, Conn::new(shared.now(), raw_fd(&stream))));
    match shared.tls.clone() {
        None => exchange(&shared, stream, addr, &conn, overflow, shutdown).await,
        Some(acceptor) => {
            let limit = Duration::from_millis(shared.settings.timeouts.header_ms);
            match tokio::time::timeout(limit, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => exchange(&shared, tls, addr, &conn, overflow, shutdown).await,
                Ok(Err(e)) => tracing::debug!(%addr, error = %e, "TLS handshake failed"),
                Err(_) => {
                    tracing::debug!(%addr, "TLS handshake too slow");
                    shared.count(Closed::Head);
                }
            }
        }
    }
    if overflow {
        shared.overflow.fetch_sub(1, Ordering::Relaxed);
    } else {
        shared.forget(id);
    }
}

/// The HTTP exchanges of one connection, whatever carries them (TCP, or TLS over it).
async fn exchange<S>(
    shared: &Arc<Shared>,
    stream: S,
    addr: SocketAddr,
    conn: &Arc<Conn>,
    overflow: bool,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = {
        let (shared, conn) = (shared.clone(), conn.clone());
        hyper::service::service_fn(move |req: Request<Incoming>| {
            answer(shared.clone(), conn.clone(), addr, overflow, req)
        })
    };
    let io = TokioIo::new(Watched { inner: stream, conn: conn.clone(), shared: shared.clone() });
    let shared = shared.clone();
    let served = http1::Builder::new().keep_alive(!overflow).max_buf_size(MAX_BUF).serve_connection(io, service);
    tokio::pin!(served);
    let mut draining = false;
    loop {
        let wake = next_wake(&shared, conn);
        tokio::select! {
            done = served.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(%addr, error = %e, "connection ended");
                }
                break;
            }
            _ = tokio::time::sleep_until(wake) => {
                conn.check_taken(shared.now());
                // Past its deadline in the phase it is still in: a head or body too slow, an
                // answer not taken, or idle too long.
                if let Some(d) = deadline(conn.phase(), shared.settings.timeouts).filter(|d| shared.now() >= d.at) {
                    tracing::debug!(%addr, reason = d.reason.as_str(), "closing a connection past its deadline");
                    shared.count(d.reason);
                    conn.drop_unsent();
                    break;
                }
            }
            _ = conn.changed.notified() => {}
            _ = conn.close.notified() => {
                if conn.phase() != Phase::Busy {
                    shared.count(Closed::Evicted);
                    conn.drop_unsent();
                    break;
                }
                served.as_mut().graceful_shutdown();
            }
            _ = shutdown.wait_for(|stop| *stop), if !draining => {
                draining = true;
                if conn.phase() != Phase::Busy {
                    break;
                }
                // The answer in flight is finished (a long-poll returns at shutdown), then closed.
                served.as_mut().graceful_shutdown();
            }
        }
    }
}

/// When the connection's loop next looks: its deadline, and while the kernel still holds an
/// answer, every [`TAKEN_CHECK`].
fn next_wake(shared: &Shared, conn: &Conn) -> tokio::time::Instant {
    let phase = conn.phase();
    let at = deadline(phase, shared.settings.timeouts).map(|d| shared.epoch + Duration::from_millis(d.at));
    let mut wake = at.map_or(tokio::time::Instant::now() + Duration::from_secs(3600), tokio::time::Instant::from_std);
    if matches!(phase, Phase::Write { .. }) && conn.answered.load(Ordering::Acquire) {
        wake = wake.min(tokio::time::Instant::now() + TAKEN_CHECK);
    }
    wake
}

/// One request: refused at the edge (T19's `Host`, an overflow connection's other routes) or
/// routed, its body and its answer watched for T15.
async fn answer(
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    addr: SocketAddr,
    overflow: bool,
    mut req: Request<Incoming>,
) -> Result<Response<Sent>, std::convert::Infallible> {
    conn.answered.store(false, Ordering::Release);
    conn.set(Phase::Busy);
    req.extensions_mut().insert(ConnectInfo(addr));
    let response = match refusal(&req, overflow) {
        // T17: the edge's own answers carry HSTS under TLS like the router's.
        Some(mut refused) if shared.tls.is_some() => {
            refused.headers_mut().insert(
                axum::http::header::STRICT_TRANSPORT_SECURITY,
                axum::http::HeaderValue::from_static(crate::tls::HSTS),
            );
            refused
        }
        Some(refused) => refused,
        None => {
            let req = req
                .map(|inner| Body::new(Received { inner, conn: conn.clone(), shared: shared.clone(), reading: false }));
            shared.router.clone().oneshot(req).await.unwrap_or_else(|never| match never {})
        }
    };
    conn.set(Phase::Write { since: shared.now() });
    Ok(response.map(|inner| Sent::new(inner, conn)))
}

/// What the edge answers without routing: 400 to HTTP/1.1 without exactly one non-empty
/// `Host` (T19; RFC 9112 section 3.2 requires one, and a request without it, or with two that
/// proxies may read differently, is a scanner, a smuggler or a broken client), 503 to an
/// overflow connection's anything but `/healthz`.
fn refusal(req: &Request<Incoming>, overflow: bool) -> Option<Response<Body>> {
    if req.version() == Version::HTTP_11 {
        let hosts: Vec<_> = req.headers().get_all(header::HOST).iter().collect();
        let problem = match hosts.as_slice() {
            [] => Some("the request has no Host header"),
            [one] if one.is_empty() || one.as_bytes().iter().any(u8::is_ascii_whitespace) => {
                Some("the request's Host header is empty or not one address")
            }
            [_] => None,
            _ => Some("the request has more than one Host header"),
        };
        if let Some(problem) = problem {
            let refused = crate::error::ServiceError::bad_request(format!(
                "{problem}, but HTTP/1.1 requires exactly one (RFC 9112 section 3.2); send Host: with the server's address"
            ));
            return Some(refused.into_response());
        }
    }
    (overflow && req.uri().path() != "/healthz").then(busy)
}

fn busy() -> Response<axum::body::Body> {
    let mut r = crate::error::ServiceError::unavailable(
        "the server is serving as many connections as it may; try again shortly (/healthz still answers)",
    )
    .into_response();
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    r
}

/// The stream, telling its connection when bytes arrive (an idle connection's next head
/// starts then).
struct Watched<S> {
    inner: S,
    conn: Arc<Conn>,
    shared: Arc<Shared>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.bytes_arrived(self.shared.now());
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(flushed, Poll::Ready(Ok(()))) {
            // hyper flushes once its buffer is empty: the answer may be taken already.
            self.conn.check_taken(self.shared.now());
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request's body as the handler reads it: T15's clock starts when the handler first asks
/// for it (a handler that has not asked yet is the server's wait, not the client's), each
/// frame counts its bytes, and its end (or drop) hands the connection back to busy.
struct Received {
    inner: Incoming,
    conn: Arc<Conn>,
    shared: Arc<Shared>,
    reading: bool,
}

impl Received {
    fn ended(&self) {
        self.conn.shift(|p| matches!(p, Phase::Body { .. }).then_some(Phase::Busy));
    }
}

impl hyper::body::Body for Received {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if !self.reading && !self.inner.is_end_stream() {
            self.reading = true;
            let since = self.shared.now();
            self.conn.shift(|p| (p == Phase::Busy).then_some(Phase::Body { since, received: 0 }));
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                self.conn.shift(|p| match p {
                    Phase::Body { since, received } => {
                        Some(Phase::Body { since, received: received.saturating_add(n) })
                    }
                    _ => None,
                });
                if self.inner.is_end_stream() {
                    self.ended();
                }
            }
            Poll::Ready(_) => self.ended(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        self.ended();
    }
}

/// An answer's body as hyper takes it: when it has all of it, the connection waits for the
/// client to take the rest (T15's write deadline keeps running until then).
struct Sent {
    inner: Body,
    conn: Arc<Conn>,
}

impl Sent {
    fn new(inner: Body, conn: Arc<Conn>) -> Sent {
        if inner.is_end_stream() {
            conn.answered.store(true, Ordering::Release);
        }
        Sent { inner, conn }
    }
}

impl hyper::body::Body for Sent {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) || self.inner.is_end_stream() {
            self.conn.answered.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Sent {
    fn drop(&mut self) {
        self.conn.answered.store(true, Ordering::Release);
    }
}

/// `SO_LINGER` 0: closing the socket sends a reset and frees its buffers at once.
fn reset_on_close(fd: Option<i32>) {
    #[cfg(unix)]
    if let Some(fd) = fd {
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        let len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
        // SAFETY: sets one option on this connection's own socket (open while its exchange
        // runs) from a struct that outlives the call.
        unsafe {
            libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, (&raw const linger).cast(), len);
        }
    }
    #[cfg(not(unix))]
    let _ = fd;
}

#[cfg(unix)]
fn raw_fd(stream: &TcpStream) -> Option<i32> {
    use std::os::fd::AsRawFd;
    Some(stream.as_raw_fd())
}

#[cfg(not(unix))]
fn raw_fd(_: &TcpStream) -> Option<i32> {
    None
}

/// Bytes written to the socket that its peer has not acknowledged (Linux's `SIOCOUTQ`): an
/// answer in the kernel's buffers is not taken until the client's side has it. 0 where the
/// kernel cannot say, so there an answer is taken once written.
fn unacknowledged(fd: Option<i32>) -> u64 {
    #[cfg(target_os = "linux")]
    if let Some(fd) = fd {
        let mut n: libc::c_int = 0;
        // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int; `fd` is this connection's socket, open
        // for as long as its exchange runs, which is when this is called.
        if unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) } == 0 {
            return u64::try_from(n).unwrap_or(0);
        }
    }
    let _ = fd;
    0
}

/// The process's open-file limit, after raising its soft limit to the hard one (systemd's
/// default soft limit is 1,024): the connection limit is kept under it.
pub fn file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit only read and write the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return None;
            }
            let wanted = lim.rlim_max.min(1 << 20);
            if lim.rlim_cur < wanted {
                let raised = libc::rlimit { rlim_cur: wanted, rlim_max: lim.rlim_max };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    lim.rlim_cur = wanted;
                }
            }
        }
        #[allow(clippy::useless_conversion)] // rlim_t is u64 on Linux, varies elsewhere
        Some(u64::from(lim.rlim_cur))
    }
    #[cfg(not(unix))]
    {
        None
    }
}
