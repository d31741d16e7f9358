//! `serve`: runs the server until SIGTERM or Ctrl-C.

use anyhow::Context;
use pcmail_server::ServeConfig;

use crate::args::ServeArgs;

pub async fn run(args: ServeArgs) -> anyhow::Result<i32> {
    args.logging.init("info");
    let config = ServeConfig {
        data_dir: args.store.data_dir,
        store_url: args.store.store,
        listen: args.listen,
        apply: args.apply,
        insecure_listen: args.insecure_listen,
        tls: args.tls_cert.zip(args.tls_key),
        resync: args.resync.to_std(),
        lease: args.lease.to_std(),
        max_connections: args.max_connections,
        header_timeout: args.header_timeout.to_std(),
        idle_timeout: args.idle_timeout.to_std(),
        body_timeout: args.body_timeout.to_std(),
        write_timeout: args.write_timeout.to_std(),
        shutdown_grace: args.shutdown_grace.to_std(),
        search_index: !args.no_search_index,
    };
    pcmail_server::serve(config, shutdown_signal()).await.context("serve")?;
    Ok(0)
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutting down");
}
