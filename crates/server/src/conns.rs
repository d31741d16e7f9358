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
use pcmail_core::conns::{Closed, Deadline, Phase, Timeouts, deadline, evictee};
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
const TAKEN_CHECK_MS: u64 = 50;

#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Connections served at once (already bounded by the file descriptors the process has).
    pub limit: usize,
    pub timeouts: Timeouts,
}

/// One connection's shared state: its phase, a wake-up when the phase moves outside the
/// connection's own poll, and the order to close.
struct Conn {
    state: Mutex<State>,
    changed: Notify,
    close: Notify,
    /// The answer's body has been handed to hyper to its end (what is left is in the socket).
    answered: AtomicBool,
    /// The socket, to ask how much of the answer the client has not acknowledged yet.
    fd: Option<i32>,
}

#[derive(Debug, Clone, Copy)]
struct State {
    phase: Phase,
    /// The connection's own task is polling its exchange: a move made now is seen when that
    /// poll ends ([`Watch`]), and wakes nobody.
    minding: bool,
}

impl Conn {
    fn new(now: u64, fd: Option<i32>) -> Arc<Conn> {
        Arc::new(Conn {
            state: Mutex::new(State { phase: Phase::Head { since: now }, minding: false }),
            changed: Notify::new(),
            close: Notify::new(),
            answered: AtomicBool::new(false),
            fd,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves from one phase to the next only if `from` accepts the current one: the body and
    /// answer wrappers report late (a body dropped after its answer) and must not undo a move.
    fn shift(&self, from: impl FnOnce(Phase) -> Option<Phase>) {
        let mut state = self.state();
        if let Some(next) = from(state.phase) {
            state.phase = next;
            let minding = state.minding;
            drop(state);
            if !minding {
                self.changed.notify_one();
            }
        }
    }

    /// Runs `f` as the connection's own poll: the moves it makes wake nobody.
    fn minding<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Done<'a>(&'a Conn);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.state().minding = false;
            }
        }
        self.state().minding = true;
        let _done = Done(self);
        f()
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
        self.state().phase
    }

    fn set(&self, next: Phase) {
        self.shift(|_| Some(next));
    }

    /// Bytes arrived: an idle connection starts its next request's head now.
    fn bytes_arrived(&self, now: u64) {
        self.shift(|p| matches!(p, Phase::Idle { .. }).then_some(Phase::Head { since: now }));
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
        ms_since(self.epoch)
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
    let timer = tokio::time::sleep_until(instant_at(shared.epoch, NEVER));
    tokio::pin!(timer);
    let mut watch = Watch::new(served.as_mut(), timer.as_mut(), conn, (shared.epoch, shared.settings.timeouts));
    let mut draining = false;
    loop {
        tokio::select! {
            turn = &mut watch => {
                match turn {
                    Turn::Served(Err(e)) => tracing::debug!(%addr, error = %e, "connection ended"),
                    Turn::Served(Ok(())) => {}
                    // Past its deadline in the phase it is still in: a head or body too slow,
                    // an answer not taken, or idle too long.
                    Turn::Expired(d) => {
                        tracing::debug!(%addr, reason = d.reason.as_str(), "closing a connection past its deadline");
                        shared.count(d.reason);
                        conn.drop_unsent();
                    }
                }
                break;
            }
            _ = conn.changed.notified() => {}
            _ = conn.close.notified() => {
                if conn.phase() != Phase::Busy {
                    shared.count(Closed::Evicted);
                    conn.drop_unsent();
                    break;
                }
                watch.served.as_mut().graceful_shutdown();
            }
            _ = shutdown.wait_for(|stop| *stop), if !draining => {
                draining = true;
                if conn.phase() != Phase::Busy {
                    break;
                }
                // The answer in flight is finished (a long-poll returns at shutdown), then closed.
                watch.served.as_mut().graceful_shutdown();
            }
        }
    }
}

/// A deadline no phase has (busy: the answer is the server's to give), as ms after `epoch`.
const NEVER: u64 = 1 << 40;

/// The connections' clock: ms since `epoch`.
fn ms_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// `ms` after `epoch`, as the timer takes it.
fn instant_at(epoch: Instant, ms: u64) -> tokio::time::Instant {
    tokio::time::Instant::from_std(epoch + Duration::from_millis(ms))
}

/// What ends a connection's exchange from within: its own end, or a deadline passed.
enum Turn {
    Served(hyper::Result<()>),
    Expired(Deadline),
}

/// A connection's exchange and its deadline timer as one future. Its phase moves inside the
/// exchange's own poll (a head's first bytes, the body, the answer), so the timer is re-armed
/// as that poll ends: a wake-up at each move, from the task to itself, made every request
/// yield its worker and wake the other (P10). A move from elsewhere still wakes the loop
/// through `changed`.
struct Watch<'a, F> {
    served: Pin<&'a mut F>,
    timer: Pin<&'a mut tokio::time::Sleep>,
    conn: &'a Conn,
    /// The connections' epoch and timeouts.
    clock: (Instant, Timeouts),
    /// T15: when an answer all handed to the socket is next asked after, every [`TAKEN_CHECK_MS`]
    /// until the client has it.
    taken_check: Option<u64>,
    in_place: InPlace,
}

/// P10: the wakes an exchange gives itself, served in place. hyper wakes the connection's
/// task from within its own poll (a body asked for wakes the dispatcher that reads it, and its
/// frames wake the body); tokio takes such a wake for a yield: it queues the task and wakes
/// another worker to steal it, a thread woken, and often moved to, at every request. A wake
/// during the poll is noted and the exchange polled again at once, [`AGAIN`] times at most, so
/// a deliberate yield (hyper's, or a spent budget) still reaches tokio; a wake after the poll
/// goes to the task's own waker.
struct InPlace {
    wakes: Arc<Wakes>,
    waker: std::task::Waker,
}

/// How many times an exchange is polled again in place before its wake goes to tokio.
const AGAIN: usize = 4;

/// Whether the exchange is being polled and was woken meanwhile, and the task to wake after.
struct Wakes {
    state: std::sync::atomic::AtomicU8,
    task: Mutex<std::task::Waker>,
}

const IDLE: u8 = 0;
const POLLING: u8 = 1;
const WOKEN: u8 = 2;

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Noted while the poll runs (it looks when it ends); the task's otherwise. A wake that
        // loses the race with the poll's end finds IDLE and goes to the task: none is lost.
        if self.state.compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire) == Err(IDLE) {
            let task = self.task.lock().unwrap_or_else(PoisonError::into_inner).clone();
            task.wake();
        }
    }
}

impl InPlace {
    fn new() -> InPlace {
        let wakes = Arc::new(Wakes {
            state: std::sync::atomic::AtomicU8::new(IDLE),
            task: Mutex::new(std::task::Waker::noop().clone()),
        });
        InPlace { waker: std::task::Waker::from(wakes.clone()), wakes }
    }

    fn poll<F: std::future::Future>(&self, mut fut: Pin<&mut F>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.wakes.task.lock().unwrap_or_else(PoisonError::into_inner).clone_from(cx.waker());
        let mut own = Context::from_waker(&self.waker);
        for _ in 0..AGAIN {
            self.wakes.state.store(POLLING, Ordering::Release);
            let polled = fut.as_mut().poll(&mut own);
            let woken = self.wakes.state.swap(IDLE, Ordering::AcqRel) == WOKEN;
            if polled.is_ready() || !woken {
                return polled;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<'a, F> Watch<'a, F> {
    fn new(
        served: Pin<&'a mut F>,
        timer: Pin<&'a mut tokio::time::Sleep>,
        conn: &'a Conn,
        clock: (Instant, Timeouts),
    ) -> Self {
        Watch { served, timer, conn, clock, taken_check: None, in_place: InPlace::new() }
    }
}

impl<F: std::future::Future<Output = hyper::Result<()>>> std::future::Future for Watch<'_, F> {
    type Output = Turn;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Turn> {
        let this = &mut *self;
        let (conn, (epoch, timeouts)) = (this.conn, this.clock);
        if let Poll::Ready(done) = conn.minding(|| this.in_place.poll(this.served.as_mut(), cx)) {
            return Poll::Ready(Turn::Served(done));
        }
        loop {
            let phase = conn.phase();
            let due = deadline(phase, timeouts);
            let awaiting_taken = matches!(phase, Phase::Write { .. }) && conn.answered.load(Ordering::Acquire);
            if !awaiting_taken {
                this.taken_check = None;
            } else if this.taken_check.is_none() {
                this.taken_check = Some(ms_since(epoch).saturating_add(TAKEN_CHECK_MS));
            }
            let look = due.map_or(NEVER, |d| d.at).min(this.taken_check.unwrap_or(NEVER)).min(NEVER);
            let at = instant_at(epoch, look);
            if this.timer.deadline() != at {
                this.timer.as_mut().reset(at);
            }
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = ms_since(epoch);
            if awaiting_taken {
                conn.minding(|| conn.check_taken(now));
                this.taken_check = Some(now.saturating_add(TAKEN_CHECK_MS));
            }
            if let Some(d) = deadline(conn.phase(), timeouts).filter(|d| now >= d.at) {
                return Poll::Ready(Turn::Expired(d));
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `changed` holds a wake-up for the connection's loop.
    fn woken(conn: &Conn) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        std::pin::pin!(conn.changed.notified()).poll(&mut cx).is_ready()
    }

    #[test]
    fn p10_t15_a_phase_moved_within_the_connections_own_poll_wakes_nobody_and_one_moved_elsewhere_wakes_its_loop() {
        let conn = Conn::new(0, None);
        conn.minding(|| conn.set(Phase::Busy));
        assert_eq!(conn.phase(), Phase::Busy);
        assert!(!woken(&conn), "a move inside the connection's own poll is seen as that poll ends");
        conn.set(Phase::Write { since: 5 });
        assert!(woken(&conn), "a move from another task wakes the loop to re-arm its deadline");
        assert_eq!(conn.phase(), Phase::Write { since: 5 });
    }

    /// A task's waker that counts its wakes.
    #[derive(Default)]
    struct Counted(AtomicUsize);

    impl std::task::Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn p10_a_wake_an_exchange_gives_itself_is_served_in_place_and_one_after_its_poll_reaches_the_task() {
        let task = Arc::new(Counted::default());
        let waker = std::task::Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        let woken = || task.0.load(Ordering::Relaxed);
        let in_place = InPlace::new();

        let mut polls = 0;
        let wakes_itself_once = std::pin::pin!(std::future::poll_fn(|cx| {
            polls += 1;
            if polls == 1 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(polls)
        }));
        assert_eq!(in_place.poll(wakes_itself_once, &mut cx), Poll::Ready(2), "polled again at once");
        assert_eq!(woken(), 0, "the task was not woken for it");

        let mut kept = None;
        let keeps_its_waker = std::pin::pin!(std::future::poll_fn(|cx| {
            kept = Some(cx.waker().clone());
            Poll::<()>::Pending
        }));
        assert!(in_place.poll(keeps_its_waker, &mut cx).is_pending());
        assert_eq!(woken(), 0);
        let kept = kept.expect("the exchange kept its waker");
        kept.wake_by_ref();
        assert_eq!(woken(), 1, "a wake after the poll reaches the task");

        // The task's waker can change between polls: the wake goes to the latest.
        let moved = Arc::new(Counted::default());
        let moved_waker = std::task::Waker::from(moved.clone());
        let pending = std::pin::pin!(std::future::pending::<()>());
        assert!(in_place.poll(pending, &mut Context::from_waker(&moved_waker)).is_pending());
        kept.wake();
        assert_eq!((woken(), moved.0.load(Ordering::Relaxed)), (1, 1), "woken through the waker of the last poll");

        let mut polls = 0;
        let always_wakes_itself = std::pin::pin!(std::future::poll_fn(|cx| {
            polls += 1;
            cx.waker().wake_by_ref();
            Poll::<()>::Pending
        }));
        assert!(in_place.poll(always_wakes_itself, &mut cx).is_pending());
        assert_eq!(polls, AGAIN, "polled again in place a few times at most");
        assert_eq!(woken(), 2, "then the wake goes to the task: a yield still yields");
    }

    #[test]
    fn p10_the_watch_polls_its_exchange_in_place() {
        let task = Arc::new(Counted::default());
        let waker = std::task::Waker::from(task.clone());
        let conn = Conn::new(0, None);
        conn.set(Phase::Busy);
        let epoch = Instant::now();
        let mut polls = 0;
        let served = std::pin::pin!(std::future::poll_fn(|cx| {
            polls += 1;
            if polls == 1 {
                cx.waker().wake_by_ref();
            }
            Poll::<hyper::Result<()>>::Pending
        }));
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        let _in_rt = rt.enter();
        let timer = std::pin::pin!(tokio::time::sleep_until(instant_at(epoch, NEVER)));
        let mut watch = Watch::new(served, timer, &conn, (epoch, pcmail_core::conns::TIMEOUTS));
        assert!(Pin::new(&mut watch).poll(&mut Context::from_waker(&waker)).is_pending());
        drop(watch);
        assert_eq!(polls, 2, "the exchange's wake of itself polled it again at once");
        assert_eq!(task.0.load(Ordering::Relaxed), 0, "and did not wake the task");
    }

    #[tokio::test]
    async fn t15_a_head_started_inside_the_exchanges_own_poll_is_cut_at_its_deadline_with_no_wake_up() {
        let timeouts = Timeouts { header_ms: 100, ..pcmail_core::conns::TIMEOUTS };
        let conn = Conn::new(0, None);
        conn.set(Phase::Idle { since: 0 });
        let _ = woken(&conn);
        let epoch = Instant::now();
        // The exchange: a request's first bytes arrive at its first poll, and nothing more.
        let mut arrived = false;
        let exchange = std::future::poll_fn(|_| {
            if !arrived {
                arrived = true;
                conn.bytes_arrived(ms_since(epoch));
            }
            Poll::<hyper::Result<()>>::Pending
        });
        let served = std::pin::pin!(exchange);
        let timer = std::pin::pin!(tokio::time::sleep_until(instant_at(epoch, NEVER)));
        let watch = Watch::new(served, timer, &conn, (epoch, timeouts));
        let turn = tokio::time::timeout(Duration::from_secs(5), watch).await.expect("cut long before the idle timeout");
        assert!(matches!(turn, Turn::Expired(Deadline { reason: Closed::Head, .. })));
        assert!(epoch.elapsed() >= Duration::from_millis(100), "not before the head's deadline");
        assert!(!woken(&conn), "the move to a head woke nobody: the watch re-armed its timer as its poll ended");
    }

    /// The exchange that never ends on its own.
    fn pending_exchange() -> impl std::future::Future<Output = hyper::Result<()>> {
        std::future::pending()
    }

    #[tokio::test]
    async fn t15_an_answer_handed_to_the_socket_is_asked_after_until_taken_and_the_connection_is_then_idle() {
        let conn = Conn::new(0, None);
        conn.set(Phase::Write { since: 0 });
        conn.answered.store(true, Ordering::Release);
        let epoch = Instant::now();
        let served = std::pin::pin!(pending_exchange());
        let timer = std::pin::pin!(tokio::time::sleep_until(instant_at(epoch, NEVER)));
        let mut watch = Watch::new(served, timer, &conn, (epoch, pcmail_core::conns::TIMEOUTS));
        // No socket: nothing is unacknowledged, so the first check finds the answer taken.
        let ended = tokio::time::timeout(Duration::from_millis(500), &mut watch).await;
        assert!(ended.is_err(), "an idle connection has a minute before it is closed");
        assert!(matches!(conn.phase(), Phase::Idle { .. }), "taken at the check {TAKEN_CHECK_MS} ms on");
        assert_eq!(watch.taken_check, None, "nothing left to ask after");
    }

    #[tokio::test]
    async fn t15_a_body_started_by_another_task_wakes_the_loop_and_is_cut_at_its_deadline() {
        let timeouts = Timeouts { body_ms: 200, ..pcmail_core::conns::TIMEOUTS };
        let conn = Conn::new(0, None);
        conn.set(Phase::Busy);
        let epoch = Instant::now();
        let served = std::pin::pin!(pending_exchange());
        let timer = std::pin::pin!(tokio::time::sleep_until(instant_at(epoch, NEVER)));
        let mut watch = Watch::new(served, timer, &conn, (epoch, timeouts));
        let elsewhere = conn.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            elsewhere.set(Phase::Body { since: ms_since(epoch), received: 0 });
        });
        // The connection's loop, as `exchange` runs it.
        let turn = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                tokio::select! {
                    turn = &mut watch => break turn,
                    _ = conn.changed.notified() => {}
                }
            }
        })
        .await
        .expect("a busy connection has no deadline of its own: the body's came through the wake-up");
        assert!(matches!(turn, Turn::Expired(Deadline { reason: Closed::Body | Closed::SlowBody, .. })));
    }
}
