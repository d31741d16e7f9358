//! LISTEN pcmail on a connection of its own, turned into [`Change`]s. When the connection
//! drops it reconnects with backoff and announces [`Change::Missed`], so every waiter looks
//! again: what was committed meanwhile is found by the look, not by the lost announcement.

use std::time::Duration;

use tokio::sync::broadcast;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::Change;

pub fn parse(payload: &str) -> Option<Change> {
    match payload.split_once(':') {
        Some(("mail", to)) => Some(Change::Mail { to: to.to_string() }),
        _ => match payload {
            "mail" => Some(Change::MailMoved),
            "jobs" => Some(Change::Jobs),
            "specs" => Some(Change::Specs),
            _ => None,
        },
    }
}

/// Runs until aborted (the store's last handle dropped).
pub async fn run(config: tokio_postgres::Config, changes: broadcast::Sender<Change>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if listen_once(&config, &changes).await {
            backoff = Duration::from_millis(100);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// One connection's life; answers whether it got as far as listening.
async fn listen_once(config: &tokio_postgres::Config, changes: &broadcast::Sender<Change>) -> bool {
    let Ok((client, mut connection)) = config.connect(NoTls).await else {
        return false;
    };
    let forward = changes.clone();
    let mut driver = tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if let Some(change) = parse(n.payload()) {
                        // Nobody subscribed is fine.
                        let _ = forward.send(change);
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    let listening = tokio::select! {
        r = client.batch_execute("LISTEN pcmail") => r.is_ok(),
        _ = &mut driver => false,
    };
    if listening {
        // Anything committed while we were not listening was not announced to us.
        let _ = changes.send(Change::Missed);
        let _ = (&mut driver).await;
    }
    driver.abort();
    drop(client);
    listening
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_name_the_change() {
        assert_eq!(parse("mail:pc-2"), Some(Change::Mail { to: "pc-2".into() }));
        assert_eq!(parse("mail:a:b"), Some(Change::Mail { to: "a:b".into() }));
        assert_eq!(parse("mail"), Some(Change::MailMoved));
        assert_eq!(parse("jobs"), Some(Change::Jobs));
        assert_eq!(parse("specs"), Some(Change::Specs));
        assert_eq!(parse("other"), None);
    }
}
