//! E1: how long an HTTP connection may take, and which one goes when the server is full. A
//! client must send a request's head within the header timeout (a slowloris is cut off); a
//! connection idle between requests is closed after the idle timeout; and when every slot is
//! taken, the connection that has waited longest without a request in flight makes room, so
//! `/healthz` and real requests are still served whatever a flood of idle sockets does.
//! Times are milliseconds on the caller's monotonic clock.

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for (the rest of) a request's head, since this moment: a new connection, or
    /// bytes of the next request arrived.
    Head { since: u64 },
    /// A request is being answered (a long-poll included): never timed out, never evicted.
    Busy,
    /// Between requests since this moment.
    Idle { since: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub header_ms: u64,
    pub idle_ms: u64,
}

/// DESIGN E1: 10 s for a request's head, 60 s idle.
pub const TIMEOUTS: Timeouts = Timeouts { header_ms: 10_000, idle_ms: 60_000 };

/// When a connection in `phase` is to be closed, if nothing happens before.
pub fn deadline(phase: Phase, t: Timeouts) -> Option<u64> {
    match phase {
        Phase::Head { since } => Some(since.saturating_add(t.header_ms)),
        Phase::Idle { since } => Some(since.saturating_add(t.idle_ms)),
        Phase::Busy => None,
    }
}

/// The connection to close so a new one can be served: the one waiting longest without a
/// request in flight. None when every connection is busy.
pub fn evictee<K: Copy>(conns: impl IntoIterator<Item = (K, Phase)>) -> Option<K> {
    conns
        .into_iter()
        .filter_map(|(k, p)| match p {
            Phase::Head { since } | Phase::Idle { since } => Some((since, k)),
            Phase::Busy => None,
        })
        .min_by_key(|(since, _)| *since)
        .map(|(_, k)| k)
}

/// File descriptors kept for everything but client connections: the store's connections and
/// files, Functions' pipes, and the connections served beyond the limit to answer `/healthz`.
pub const RESERVED_FDS: u64 = 128;

/// How many connections are served at once: `--max-connections`, and never so many that the
/// process would run out of file descriptors (`nofile`, its limit, when known).
pub fn limit(max_connections: usize, nofile: Option<u64>) -> usize {
    let fds = nofile.map_or(usize::MAX, |n| usize::try_from(n.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX));
    max_connections.min(fds).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e1_a_head_has_10s_an_idle_connection_60s_and_a_busy_one_no_deadline() {
        assert_eq!(deadline(Phase::Head { since: 5 }, TIMEOUTS), Some(10_005));
        assert_eq!(deadline(Phase::Idle { since: 5 }, TIMEOUTS), Some(60_005));
        assert_eq!(deadline(Phase::Busy, TIMEOUTS), None, "a long-poll is never cut");
    }

    #[test]
    fn e1_when_full_the_longest_waiting_connection_without_a_request_makes_room() {
        let conns = [
            (1, Phase::Busy),
            (2, Phase::Idle { since: 30 }),
            (3, Phase::Head { since: 10 }),
            (4, Phase::Idle { since: 20 }),
        ];
        assert_eq!(evictee(conns), Some(3));
        assert_eq!(evictee([(1, Phase::Busy), (2, Phase::Busy)]), None, "busy ones are never dropped");
    }

    #[test]
    fn e1_the_limit_leaves_file_descriptors_for_the_rest_of_the_server() {
        assert_eq!(limit(2048, None), 2048);
        assert_eq!(limit(2048, Some(1024)), 896);
        assert_eq!(limit(2048, Some(1_048_576)), 2048);
        assert_eq!(limit(2048, Some(10)), 1, "always at least one");
    }
}
