//! V2 and V5: which releases work together, and the one sentence each side says when they do
//! not. Pure: versions come in as text (a `User-Agent`, a `Server` header, a schema number).

use std::fmt;

/// This build's release (the workspace's version).
pub const THIS: &str = env!("CARGO_PKG_VERSION");

/// A release, `MAJOR.MINOR.PATCH` (SemVer, V6); a pre-release or build suffix is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl Release {
    pub fn parse(s: &str) -> Option<Release> {
        let core = s.split(['-', '+']).next()?;
        let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
        let (major, minor, patch) = (parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some(Release { major, minor, patch })
    }

    /// This build's own release.
    pub fn this() -> Release {
        Release::parse(THIS).unwrap_or(Release { major: 0, minor: 0, patch: 0 })
    }

    /// The oldest release a peer may run to be served: this one's previous minor (V2).
    fn oldest_served(self) -> Release {
        Release { major: self.major, minor: self.minor.saturating_sub(1), patch: 0 }
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The header a server names its release in on every answer: `Server: pcmail/VERSION`.
pub const SERVER_PREFIX: &str = "pcmail/";

/// The release in a `Server: pcmail/VERSION` header, when it is ours.
pub fn server_release(header: &str) -> Option<Release> {
    Release::parse(header.strip_prefix(SERVER_PREFIX)?.split_whitespace().next()?)
}

/// The release in a client's `User-Agent: pcmail-ctl/VERSION (OS)`, when it is ours.
pub fn client_release(user_agent: &str) -> Option<Release> {
    Release::parse(user_agent.strip_prefix("pcmail-ctl/")?.split_whitespace().next()?)
}

/// V2: whether a peer of release `peer` is served by `ours`: its own release line or the
/// previous minor, never an older one nor another major. A newer peer is for the newer side
/// to judge (it knows what it still serves), so it passes here.
pub fn serves(ours: Release, peer: Release) -> bool {
    if peer.major != ours.major {
        return peer.major > ours.major;
    }
    peer >= ours.oldest_served()
}

/// V2: the server's sentence to a client outside its window.
pub fn client_too_old(server: Release, client: Release) -> String {
    format!(
        "this pcmail-ctl ({client}) is older than the server ({server}) serves ({}+); upgrade pcmail-ctl",
        server.oldest_served()
    )
}

/// V2: the client's sentence about a server outside its window.
pub fn server_outside_window(client: Release, server: Release) -> String {
    format!(
        "the server ({server}) is older than this pcmail-ctl ({client}) serves ({}+); upgrade the server",
        client.oldest_served()
    )
}

/// V5: what a build that knows `known` migrations does with a store at schema `found`, whose
/// newest build recorded that builds knowing `readable_by` migrations or more can use it (the
/// migrations after that only add). None: the store says nothing, so a newer one is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaFit {
    /// Older: this build runs the migrations the store lacks.
    Migrate,
    Current,
    /// Newer by migrations that only add: used as it is, never migrated, so a replica of the
    /// previous release restarts beside a newer one on one PostgreSQL.
    Newer,
    /// Newer by a migration this build cannot live with, or newer and silent about it.
    Refused,
}

pub fn schema_fit(found: usize, known: usize, readable_by: Option<usize>) -> SchemaFit {
    match found.cmp(&known) {
        std::cmp::Ordering::Less => SchemaFit::Migrate,
        std::cmp::Ordering::Equal => SchemaFit::Current,
        std::cmp::Ordering::Greater if readable_by.is_some_and(|r| r <= known) => SchemaFit::Newer,
        std::cmp::Ordering::Greater => SchemaFit::Refused,
    }
}

/// V5: the sentence refusing a store whose schema is newer than this build's.
pub fn newer_schema(found: usize, known: usize) -> String {
    format!(
        "the store's schema is version {found}, newer than this pcmail-ctl ({THIS}) knows (version {known}); \
         upgrade pcmail-ctl"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> Release {
        Release::parse(s).expect("a release")
    }

    #[test]
    fn v2_a_release_parses_from_semver_and_from_our_headers_only() {
        assert_eq!(r("0.2.0"), Release { major: 0, minor: 2, patch: 0 });
        assert_eq!(r("1.4.2-rc.1"), Release { major: 1, minor: 4, patch: 2 });
        assert_eq!(Release::parse("0.2"), None);
        assert_eq!(Release::parse("0.2.0.1"), None);
        assert_eq!(client_release("pcmail-ctl/0.2.1 (linux)"), Some(r("0.2.1")));
        assert_eq!(client_release("curl/8.5.0"), None, "curl is not judged");
        assert_eq!(server_release("pcmail/0.3.0"), Some(r("0.3.0")));
        assert_eq!(server_release("nginx/1.25"), None);
        assert_eq!(Release::this().to_string(), THIS);
    }

    #[test]
    fn v2_a_side_serves_its_own_and_the_previous_minor_release() {
        let server = r("0.3.2");
        assert!(serves(server, r("0.3.0")), "its own release line");
        assert!(serves(server, r("0.2.9")), "the previous minor");
        assert!(serves(server, r("0.4.0")), "a newer peer judges itself");
        assert!(!serves(server, r("0.1.5")), "two minors back");
        assert!(!serves(r("1.0.0"), r("0.9.0")), "another major");
        assert!(serves(r("1.0.0"), r("2.0.0")));
        assert!(serves(r("0.0.3"), r("0.0.1")), "0.0.x: minor 0 has no previous");
    }

    #[test]
    fn v2_outside_the_window_one_sentence_names_both_versions() {
        let told = client_too_old(r("0.3.0"), r("0.1.0"));
        assert_eq!(
            told,
            "this pcmail-ctl (0.1.0) is older than the server (0.3.0) serves (0.2.0+); upgrade pcmail-ctl"
        );
        let told = server_outside_window(r("0.4.1"), r("0.2.0"));
        assert_eq!(
            told,
            "the server (0.2.0) is older than this pcmail-ctl (0.4.1) serves (0.3.0+); upgrade the server"
        );
    }

    #[test]
    fn v5_a_store_newer_only_by_migrations_that_add_is_used_as_it_is_and_any_other_newer_refused() {
        assert_eq!(schema_fit(7, 8, Some(0)), SchemaFit::Migrate);
        assert_eq!(schema_fit(8, 8, None), SchemaFit::Current);
        assert_eq!(schema_fit(9, 8, Some(0)), SchemaFit::Newer);
        assert_eq!(schema_fit(9, 8, Some(8)), SchemaFit::Newer);
        assert_eq!(schema_fit(9, 8, Some(9)), SchemaFit::Refused, "migration 9 dropped or renamed");
        assert_eq!(schema_fit(9, 8, None), SchemaFit::Refused, "a store that says nothing");
    }

    #[test]
    fn v5_a_newer_schema_is_refused_naming_both_versions() {
        let told = newer_schema(12, 10);
        assert!(told.contains("version 12") && told.contains("version 10") && told.contains(THIS), "{told}");
    }
}
