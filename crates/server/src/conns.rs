//! E1: the HTTP connections — the one module that touches client sockets. It accepts, keeps
//! each connection's phase (waiting for a head, busy, idle; `pcmail_core::conns`), closes the
//! ones past their timeout, makes room when the server is full by closing the longest-waiting
//! connection without a request in flight, and when every slot is busy still answers
//! `/healthz` (and nothing else) on a connection of its own. On shutdown it stops accepting,
//! lets busy connections finish their answer, and returns when all are closed.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response, StatusCode};
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use pcmail_core::conns::{Phase, Timeouts, deadline, evictee};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tower::ServiceExt;

/// Connections served beyond the limit, one answer each, so `/healthz` answers when every
/// slot is busy; past these a new connection is closed at once.
const OVERFLOW: usize = 32;
/// A read buffer is grown at most to this: request heads are small, bodies stream through.
const MAX_BUF: usize = 64 * 1024;

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
}

impl Conn {
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
    fn admit(&self) -> Option<(u64, Arc<Conn>)> {
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        if conns.len() >= self.settings.limit {
            let victim = evictee(conns.iter().map(|(id, c)| (*id, c.phase())))?;
            if let Some(c) = conns.remove(&victim) {
                c.close.notify_one();
            }
            self.warn_full("connection limit reached: closing the connection idle the longest");
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            phase: Mutex::new(Phase::Head { since: self.now() }),
            changed: Notify::new(),
            close: Notify::new(),
        });
        conns.insert(id, conn.clone());
        Some((id, conn))
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

/// Serves `router` on `listener` until `shutdown` turns true, then drains.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: Settings,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    let shared = Arc::new(Shared {
        router,
        settings,
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
        match shared.admit() {
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
    let (id, conn) = slot.unwrap_or_else(|| {
        (
            u64::MAX,
            Arc::new(Conn {
                phase: Mutex::new(Phase::Head { since: shared.now() }),
                changed: Notify::new(),
                close: Notify::new(),
            }),
        )
    });
    match shared.tls.clone() {
        None => exchange(&shared, stream, addr, &conn, overflow, shutdown).await,
        Some(acceptor) => {
            let limit = Duration::from_millis(shared.settings.timeouts.header_ms);
            match tokio::time::timeout(limit, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => exchange(&shared, tls, addr, &conn, overflow, shutdown).await,
                Ok(Err(e)) => tracing::debug!(%addr, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%addr, "TLS handshake too slow"),
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
        hyper::service::service_fn(move |mut req: Request<Incoming>| {
            let (shared, conn) = (shared.clone(), conn.clone());
            conn.set(Phase::Busy);
            req.extensions_mut().insert(ConnectInfo(addr));
            async move {
                let response = if overflow && req.uri().path() != "/healthz" {
                    busy()
                } else {
                    shared.router.clone().oneshot(req).await.unwrap_or_else(|never| match never {})
                };
                conn.set(Phase::Idle { since: shared.now() });
                Ok::<_, std::convert::Infallible>(response)
            }
        })
    };
    let io = TokioIo::new(Watched { inner: stream, conn: conn.clone(), shared: shared.clone() });
    let shared = shared.clone();
    let served = http1::Builder::new().keep_alive(!overflow).max_buf_size(MAX_BUF).serve_connection(io, service);
    tokio::pin!(served);
    let mut draining = false;
    loop {
        let wake = deadline(conn.phase(), shared.settings.timeouts).map(|ms| shared.epoch + Duration::from_millis(ms));
        let far = tokio::time::Instant::now() + Duration::from_secs(3600);
        tokio::select! {
            done = served.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(%addr, error = %e, "connection ended");
                }
                break;
            }
            _ = tokio::time::sleep_until(wake.map_or(far, tokio::time::Instant::from_std)) => {
                // Past its deadline in the phase it is still in: a head too slow, or idle too long.
                if deadline(conn.phase(), shared.settings.timeouts).is_some_and(|d| shared.now() >= d) {
                    break;
                }
            }
            _ = conn.changed.notified() => {}
            _ = conn.close.notified() => {
                if conn.phase() != Phase::Busy {
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
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
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
