//! E1 and T15: how long an HTTP connection may take, and which one goes when the server is
//! full. A client must send a request's head within the header timeout (a slowloris is cut
//! off), the body it announced within the body timeout and never slower than
//! [`BODY_MIN_RATE`] after [`BODY_GRACE_MS`] (a slow body is cut off too), and take the answer
//! within the write timeout (a reader that never reads lets its buffers go); a connection idle
//! between requests is closed after the idle timeout; and when every slot is taken, the
//! connection that has waited longest on its client makes room, so `/healthz` and real
//! requests are still served whatever a flood of idle, slow or unread sockets does.
//! Times are milliseconds on the caller's monotonic clock.

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for (the rest of) a request's head, since this moment: a new connection, or
    /// bytes of the next request arrived.
    Head { since: u64 },
    /// A handler is reading the request's body: since it first asked, and how many bytes have
    /// come. The client is the one making it wait, so T15's deadline runs.
    Body { since: u64, received: u64 },
    /// A request is being answered (a long-poll included): never timed out, never evicted.
    Busy,
    /// The answer is ready and the client has not taken all of it yet, since this moment.
    Write { since: u64 },
    /// Between requests since this moment.
    Idle { since: u64 },
}

/// T15: one caller's long waits (polls and status waits) parked at once. A newer wait ends
/// the caller's oldest early — it answers what is there now, which a client repeats — so one
/// machine's waits cannot hold every connection slot, and the wait a restarted client opens
/// is never the one turned away.
pub const MAX_WAITS_PER_CALLER: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub header_ms: u64,
    pub idle_ms: u64,
    pub body_ms: u64,
    pub write_ms: u64,
}

/// DESIGN E1 and T15: 10 s for a request's head, 60 s idle, 30 s for a body, 30 s to take an
/// answer.
pub const TIMEOUTS: Timeouts = Timeouts { header_ms: 10_000, idle_ms: 60_000, body_ms: 30_000, write_ms: 30_000 };

/// T15: a body's first second is free (a client's first packets, a slow start) ...
pub const BODY_GRACE_MS: u64 = 1_000;
/// ... after which it must keep arriving at no less than this many bytes a second on average.
pub const BODY_MIN_RATE: u64 = 1_024;

crate::wire_enum! {
    /// Why the server closed a connection: the bounded label of
    /// `pcmail_connections_closed_total{reason}`.
    pub enum Closed as "close reason" {
        /// The request's head took longer than the header timeout.
        Head = "header-timeout",
        /// The body took longer than the body timeout.
        Body = "body-timeout",
        /// The body arrived slower than [`BODY_MIN_RATE`].
        SlowBody = "body-too-slow",
        /// The client did not take its answer within the write timeout.
        Write = "write-timeout",
        /// Idle past the idle timeout.
        Idle = "idle-timeout",
        /// Closed to make room for a new connection (the server was full).
        Evicted = "evicted",
    }
}

/// When a connection is to be closed if nothing happens before, and why it would be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    pub at: u64,
    pub reason: Closed,
}

/// When a connection in `phase` is to be closed, if nothing happens before.
pub fn deadline(phase: Phase, t: Timeouts) -> Option<Deadline> {
    let after = |since: u64, ms: u64, reason| Deadline { at: since.saturating_add(ms), reason };
    match phase {
        Phase::Head { since } => Some(after(since, t.header_ms, Closed::Head)),
        Phase::Body { since, received } => Some(body_deadline(since, received, t.body_ms)),
        Phase::Write { since } => Some(after(since, t.write_ms, Closed::Write)),
        Phase::Idle { since } => Some(after(since, t.idle_ms, Closed::Idle)),
        Phase::Busy => None,
    }
}

/// T15 for a body that started at `since` and has brought `received` bytes: the earlier of
/// the body timeout and the moment those bytes fall below [`BODY_MIN_RATE`] counted from the
/// end of the grace second. Each byte that arrives moves the second deadline on, so a client
/// that keeps up never meets it, and one that trickles a byte a second meets it right after
/// its first second.
pub fn body_deadline(since: u64, received: u64, body_ms: u64) -> Deadline {
    let whole = Deadline { at: since.saturating_add(body_ms), reason: Closed::Body };
    let covered_ms = received.saturating_mul(1_000) / BODY_MIN_RATE;
    let rate =
        Deadline { at: since.saturating_add(BODY_GRACE_MS).saturating_add(covered_ms), reason: Closed::SlowBody };
    if rate.at < whole.at { rate } else { whole }
}

/// The connection to close so a new one can be served: the one waiting longest on its client
/// (for a head, a body, an answer taken, or the next request). None when every connection is
/// busy: a request the server is working on is never dropped.
pub fn evictee<K: Copy>(conns: impl IntoIterator<Item = (K, Phase)>) -> Option<K> {
    conns
        .into_iter()
        .filter_map(|(k, p)| match p {
            Phase::Head { since } | Phase::Body { since, .. } | Phase::Write { since } | Phase::Idle { since } => {
                Some((since, k))
            }
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
        let at = |p| deadline(p, TIMEOUTS).map(|d| (d.at, d.reason));
        assert_eq!(at(Phase::Head { since: 5 }), Some((10_005, Closed::Head)));
        assert_eq!(at(Phase::Idle { since: 5 }), Some((60_005, Closed::Idle)));
        assert_eq!(at(Phase::Busy), None, "a long-poll is never cut");
    }

    #[test]
    fn e1_when_full_the_longest_waiting_connection_without_a_request_makes_room() {
        let conns = [
            (1, Phase::Busy),
            (2, Phase::Idle { since: 30 }),
            (3, Phase::Head { since: 10 }),
            (4, Phase::Idle { since: 20 }),
            (5, Phase::Body { since: 15, received: 9 }),
            (6, Phase::Write { since: 12 }),
        ];
        assert_eq!(evictee(conns), Some(3));
        assert_eq!(evictee([(1, Phase::Busy), (5, Phase::Body { since: 15, received: 0 })]), Some(5));
        assert_eq!(evictee([(4, Phase::Idle { since: 20 }), (6, Phase::Write { since: 12 })]), Some(6));
        assert_eq!(evictee([(1, Phase::Busy), (2, Phase::Busy)]), None, "busy ones are never dropped");
    }

    #[test]
    fn e1_the_limit_leaves_file_descriptors_for_the_rest_of_the_server() {
        assert_eq!(limit(2048, None), 2048);
        assert_eq!(limit(2048, Some(1024)), 896);
        assert_eq!(limit(2048, Some(1_048_576)), 2048);
        assert_eq!(limit(2048, Some(10)), 1, "always at least one");
    }

    #[test]
    fn t15_a_body_has_its_grace_second_then_must_keep_1kib_a_second() {
        let t = TIMEOUTS;
        // Nothing yet: the grace second is all it has.
        assert_eq!(body_deadline(100, 0, t.body_ms), Deadline { at: 1_100, reason: Closed::SlowBody });
        // A byte a second (the attack of issue #29): cut just after its first second.
        assert_eq!(body_deadline(100, 1, t.body_ms).at, 1_100);
        assert_eq!(body_deadline(100, 2, t.body_ms).reason, Closed::SlowBody);
        // Each KiB buys one more second.
        assert_eq!(body_deadline(100, 1_024, t.body_ms).at, 2_100);
        assert_eq!(body_deadline(100, 10 * 1_024, t.body_ms).at, 11_100);
        assert_eq!(
            deadline(Phase::Body { since: 100, received: 1_024 }, t),
            Some(body_deadline(100, 1_024, t.body_ms))
        );
    }

    #[test]
    fn t15_a_body_that_keeps_up_still_ends_at_the_body_timeout() {
        let t = TIMEOUTS;
        // 100 KiB in: fast enough for 101 s, but the whole body has 30 s.
        assert_eq!(body_deadline(100, 100 * 1_024, t.body_ms), Deadline { at: 30_100, reason: Closed::Body });
        assert_eq!(body_deadline(100, u64::MAX, t.body_ms), Deadline { at: 30_100, reason: Closed::Body });
        assert_eq!(body_deadline(u64::MAX - 5, 0, t.body_ms).at, u64::MAX, "no overflow");
        // A body timeout shorter than the grace second wins over it.
        assert_eq!(body_deadline(0, 0, 500), Deadline { at: 500, reason: Closed::Body });
    }

    #[test]
    fn t15_an_answer_must_be_taken_within_the_write_timeout() {
        let d = deadline(Phase::Write { since: 7 }, TIMEOUTS);
        assert_eq!(d, Some(Deadline { at: 30_007, reason: Closed::Write }));
    }

    #[test]
    fn t15_every_close_reason_is_a_distinct_bounded_label() {
        let labels: std::collections::BTreeSet<_> = Closed::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(labels.len(), Closed::ALL.len());
        assert!(labels.iter().all(|l| l.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')));
    }
}
