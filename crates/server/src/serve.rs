//! The top of the server: start-up wires the state, the leader lease, the spec sync and the
//! pools; `serve` adds the controller loop and the HTTP edge (API and console) on one listener.

use pcmail_store::{Change, Store};

use crate::app::{App, Parts};
use crate::config::{ServeConfig, ServeError};
use crate::credentials::AdminToken;
use crate::error::ServiceError;
use crate::key::Key;
use crate::wakeups::Topic;
use crate::{api, auth, conns, console, controller, leader, manifests, specs, tls};

/// Opens the store and builds the shared state, then wires what keeps it true: other
/// replicas' announcements, the leader lease's first attempt, the first spec sync and the
/// pools' workers. `serve` and the benchmarks start here.
pub async fn start(config: &ServeConfig) -> Result<App, ServeError> {
    let dir = &config.data_dir;
    pcmail_store::private::make_private(dir).map_err(|source| ServeError::DataDir { path: dir.clone(), source })?;
    // E16: what Functions of a serve killed before its stop left running dies now.
    match crate::exec::reap_left_runs(dir) {
        Ok(0) => {}
        Ok(n) => tracing::warn!(killed = n, "killed processes that Functions of an earlier serve left running (E16)"),
        Err(e) => {
            tracing::warn!(error = %e, "cannot record Functions' runs in the data dir; after a crash their strays live on (E16)")
        }
    }
    let admin_token = AdminToken::watch(dir.join(auth::ADMIN_TOKEN_FILE), auth::ensure_admin_token(dir)?);
    let url = config.store_url.clone().unwrap_or_else(|| pcmail_store::default_url(dir));
    let store = pcmail_store::open(&url, dir).await?;
    pcmail_store::transfer::check_finished(&store).await?;
    let identity = store.kv_get(pcmail_store::IDENTITY_KEY).await?.ok_or_else(|| {
        pcmail_store::StoreError::Schema("the store has no identity (E5); was it changed outside pcmail?".into())
    })?;
    let changes = store.changes();
    let parts =
        Parts { store, identity, admin_token, replica: leader::replica_name(), shared_store: changes.is_some() };
    let app = App::new(parts, config)?;
    let shared = changes.is_some();
    if let Some(changes) = changes {
        tokio::spawn(follow_changes(app.clone(), changes));
    }
    // P13: a store of this process's own has its search index filled here; P14: a shared one
    // has the search indexes a copy deferred built here.
    if config.search_index {
        tokio::spawn(controller::indexer::run(app.clone(), shared));
    }
    tokio::spawn(watch_health(app.clone()));
    tokio::spawn(controller::notifier::watch_unwritable(app.clone()));
    // Before the first sync, so a sole replica writes statuses from its first moment. E15: on
    // a full disk neither can write; serve starts anyway and serves reads (the leader task
    // tries again, the resync writes the statuses once there is room).
    tolerate_full_disk(leader::attempt(&app).await.map(drop), "the leader lease")?;
    tolerate_full_disk(specs::sync(&app, crate::clock::now()).await, "the objects' statuses")?;
    app.pools().set_task(tokio::spawn(controller::pools::run(app.clone(), config.shutdown_grace)));
    // Objects an older build stored that today's rules refuse: said once at start, and
    // on their status; everything else serves.
    for problem in &app.runtime().fenced {
        tracing::warn!("{problem}");
    }
    Ok(app)
}

/// Runs until `shutdown` resolves, then stops taking requests, wakes every long-poll and
/// returns once in-flight requests are answered.
pub async fn serve(
    config: ServeConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    if !config.listen.ip().is_loopback() && !config.insecure_listen && config.tls.is_none() {
        return Err(ServeError::InsecureListen(config.listen));
    }
    let certificate = match &config.tls {
        Some((cert, key)) => Some(tls::Certificate::load(cert, key)?),
        None => None,
    };
    let app = start(&config).await?;
    if let Some(path) = &config.apply {
        apply_at_start(&app, path).await?;
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    let connections = connection_settings(&config);
    let local = listener.local_addr()?;
    app.set_listen_addr(local);
    // Tests and scripts read this line to find a port chosen with :0.
    let scheme = if certificate.is_some() { "https" } else { "http" };
    println!("pcmail-ctl serve listening on {scheme}://{local}");
    tracing::info!(%local, data_dir = %config.data_dir.display(), connections = connections.limit, "serving");

    let controller = tokio::spawn(controller::run(app.clone()));
    let leader = tokio::spawn(leader::run(app.clone()));
    let stopping = app.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopping.begin_shutdown();
    });
    let router = if certificate.is_some() {
        router(app.clone()).layer(axum::middleware::map_response(over_tls))
    } else {
        router(app.clone())
    };
    let acceptor = certificate.map(|c| {
        tokio::spawn(c.clone().watch(std::time::Duration::from_secs(2), app.metrics().surface.tls_expiry()));
        c.acceptor()
    });
    let closed = app.metrics().surface.connections_closed();
    conns::serve(listener, router, (connections, closed), acceptor, app.watch_shutdown()).await;
    finish(&app, controller, leader).await;
    Ok(())
}

/// `--apply`'s manifests, applied before serving. E15: a store that refuses writes for want of
/// room serves what it holds; the manifests wait.
async fn apply_at_start(app: &App, path: &std::path::Path) -> Result<(), ServeError> {
    let files = manifests::read_path(path)
        .map_err(|e| ServeError::Apply { path: path.to_path_buf(), message: e.to_string() })?;
    match specs::apply(app, files, false, crate::clock::now()).await {
        Ok(_) => Ok(()),
        Err(e) if app.store().health().refusing().is_some() => {
            tracing::error!(path = %path.display(), error = %e, "--apply not applied: the store refuses writes, its disk is full (E15); serving what it holds");
            Ok(())
        }
        Err(e) => Err(ServeError::Apply { path: path.to_path_buf(), message: e.to_string() }),
    }
}

/// E1/T15: the connection limit the file descriptors allow and each phase's timeout.
fn connection_settings(config: &ServeConfig) -> conns::Settings {
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    conns::Settings {
        limit: pcmail_core::conns::limit(config.max_connections, conns::file_limit()),
        timeouts: pcmail_core::conns::Timeouts {
            header_ms: ms(config.header_timeout),
            idle_ms: ms(config.idle_timeout),
            body_ms: ms(config.body_timeout),
            write_ms: ms(config.write_timeout),
        },
    }
}

/// Once the listener stopped: waits for the loop, the leader lease and the pools to end, then
/// kills whatever Function is left.
async fn finish(app: &App, controller: tokio::task::JoinHandle<()>, leader: tokio::task::JoinHandle<()>) {
    // The loop saw the same shutdown: it stops taking keys and finishes what it runs.
    for (task, name) in [(controller, "controller"), (leader, "leader lease")] {
        if let Err(e) = task.await {
            tracing::error!(error = %e, "{name} task failed");
        }
    }
    // E17: the pools hand back what they hold — jobs claimed ahead at once, running ones
    // after the grace — and record every end before serve exits.
    if let Some(pools) = app.pools().take_task()
        && let Err(e) = pools.await
    {
        tracing::error!(error = %e, "pools task failed");
    }
    // E16: no Function outlives serve — those of pools still running are killed with every
    // process they started (a SIGKILL of serve leaves that to PR_SET_PDEATHSIG, which reaches
    // only each Function itself).
    crate::exec::stop_all();
    tracing::info!("stopped");
}

/// The API and the console on one router; what neither serves is a JSON 404.
pub(crate) fn router(app: App) -> axum::Router {
    api::routes(app.clone())
        .merge(console::routes(std::sync::Arc::default()))
        .fallback(|| async {
            ServiceError::not_found(format!("{}; the API lives under /api/v1/", pcmail_core::api::NO_SUCH_ROUTE))
        })
        .with_state(app)
        .layer(axum::middleware::map_response(name_the_release))
}

/// V2: every answer names the server's release (`Server: pcmail/VERSION`), so a client can
/// tell whether it serves this server without asking first.
async fn name_the_release(mut response: axum::response::Response) -> axum::response::Response {
    let value = format!("{}{}", pcmail_core::version::SERVER_PREFIX, pcmail_core::version::THIS);
    if let Ok(v) = axum::http::HeaderValue::from_str(&value) {
        response.headers_mut().insert(axum::http::header::SERVER, v);
    }
    response
}

/// T17: under TLS every answer asks browsers to come back only over HTTPS, and every cookie
/// it sets is `Secure`, so a session never travels in clear text.
async fn over_tls(mut response: axum::response::Response) -> axum::response::Response {
    use axum::http::{HeaderValue, header};
    let headers = response.headers_mut();
    headers.insert(header::STRICT_TRANSPORT_SECURITY, HeaderValue::from_static(tls::HSTS));
    let cookies: Vec<HeaderValue> = headers.get_all(header::SET_COOKIE).iter().cloned().collect();
    if !cookies.is_empty() {
        headers.remove(header::SET_COOKIE);
        for cookie in cookies {
            let secure = cookie.to_str().ok().map(|c| format!("{c}; Secure"));
            headers.append(header::SET_COOKIE, secure.and_then(|c| HeaderValue::from_str(&c).ok()).unwrap_or(cookie));
        }
    }
    response
}

/// E15: a start-up write refused for space is said and passed over; anything else stops serve.
fn tolerate_full_disk(result: Result<(), pcmail_store::StoreError>, what: &str) -> Result<(), ServeError> {
    match result {
        Err(e @ pcmail_store::StoreError::NoSpace(_)) => {
            tracing::error!(error = %e, "{what} not written at start: the disk is full (E15); serving reads");
            Ok(())
        }
        other => Ok(other?),
    }
}

/// The kv key a write probe touches while the store refuses writes or cannot be reached (E15).
const WRITE_PROBE_KEY: &str = "store/write-probe";
/// How long the probe may take before the watch goes on without its answer.
const PROBE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// E15/E18, once a second: the server's own tick (its uptime, so a pause is not blamed on
/// receivers); while the store refuses writes for space or cannot be reached, a one-row write
/// to see whether that is over; the store's trouble said in the log once per change and
/// reminded every minute; the write-error counters; a leadership that lapsed without an
/// attempt saying so.
async fn watch_health(app: App) {
    use pcmail_core::health::Say;
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shutdown = app.watch_shutdown();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let now = crate::clock::now();
        app.liveness().tick(now);
        let health = app.store().health();
        if health.refusing().is_some() || health.unreachable().is_some() {
            // Only a write that needs room can say the room is back, and only a write that
            // reaches the store that writes reach it again.
            // Bounded: a store that hangs must not stall the ticks (E18) or what is said here.
            let stamp = now.timestamp_millis().to_string();
            let _ = tokio::time::timeout(PROBE_WITHIN, app.store().kv_set(WRITE_PROBE_KEY, &stamp)).await;
        }
        let trouble = health.refusing().map(|r| pcmail_core::health::unwritable(&r)).or_else(|| {
            health.unreachable().map(|u| format!("the store cannot be reached; requests answer 503 ({u})"))
        });
        let failed = |r: pcmail_store::health::WriteReason| health.failed(r);
        match app.liveness().observe_store(trouble, now) {
            Some(Say::Began(t)) => tracing::error!(write_errors = failed_total(&failed), "{t}"),
            Some(Say::Still(t)) => tracing::warn!(write_errors = failed_total(&failed), "still: {t}"),
            Some(Say::Ended(t)) => tracing::info!(was = %t, "the store answers and takes writes again"),
            None => {}
        }
        app.metrics().store.set_health(health);
        leader::say_leadership(&app, None);
    }
}

fn failed_total(failed: &dyn Fn(pcmail_store::health::WriteReason) -> u64) -> u64 {
    pcmail_store::health::WriteReason::ALL.into_iter().map(failed).sum()
}

/// Turns other replicas' announced commits into the same wake-ups this replica's own writes
/// ring: long-polls, status waits, idle workers, the spec reconciler.
async fn follow_changes(app: App, mut changes: tokio::sync::broadcast::Receiver<Change>) {
    loop {
        let change = match changes.recv().await {
            Ok(c) => c,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Change::Missed,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        match change {
            Change::Mail { to } => {
                app.wakeups().wake(&Topic::Inbox(to));
                // Arrival notices (M10) are the leader's to post, whichever replica took the send.
                app.queue().add(Key::Notify);
            }
            // Another replica's announcement names no mail: every status wait looks again.
            Change::MailMoved => app.wakeups().wake_all(|t| matches!(t, Topic::Mail(_))),
            Change::Jobs => app.pools().ring(),
            Change::Specs => app.queue().add(Key::Specs),
            Change::Missed => {
                app.wakeups().wake_all(|_| true);
                app.pools().ring();
                app.queue().add(Key::Specs);
            }
        }
    }
}
