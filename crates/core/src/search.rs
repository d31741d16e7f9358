//! T14 and U5: what a search looks for and for how long — the text's bound, the time budget and
//! what `truncated` means, the trigrams an index is asked for, when a field holds the text, and
//! (P13) which mail the index, kept off the send path, takes next.
//! No IO and no clock: the stores read the time and hand in how long they have been looking.

use std::time::Duration;

/// T14: the longest text a search takes, in characters.
pub const MAX_TEXT: usize = 256;

/// T14: how long a search looks before it answers what it has, marked `truncated`.
pub const BUDGET: Duration = Duration::from_secs(2);

/// T14: the one line the CLI and the MCP tool add under an answer that was cut.
pub const TRUNCATED: &str = "search stopped at its time budget: there may be more (a longer text finds fewer)";

crate::wire_enum! {
    /// U5: what a search looks in (both when a request names neither).
    pub enum Scope as "search scope" {
        Mail = "mail",
        Ledger = "ledger",
    }
}

/// A search's text, folded once, as every candidate field is compared with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needle {
    folded: String,
}

impl Needle {
    pub fn new(text: &str) -> Needle {
        Needle { folded: text.to_lowercase() }
    }

    /// Whether `field` holds the text, whatever its case. Linear in the field (std's two-way
    /// search), so a field of 65,000 `Z` costs what any field of its length costs — a naive
    /// matcher (SQLite's LIKE, FTS5's phrase test) is quadratic there.
    pub fn found_in(&self, field: &str) -> bool {
        field.to_lowercase().contains(&self.folded)
    }
}

/// The trigrams a trigram index is asked for, each once (whatever its case): a field holding
/// the text holds every one. None for a text shorter than three characters, which such an
/// index cannot find (U5: those are found by a scan).
pub fn trigrams(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut seen = std::collections::BTreeSet::new();
    chars.windows(3).map(|w| w.iter().collect::<String>()).filter(|t| seen.insert(t.to_lowercase())).collect()
}

/// P13: the most mail the search index takes in one transaction, so a send waits behind the
/// indexer for a few milliseconds at most (a store copied in whole catches up batch by batch).
pub const INDEX_BATCH: i64 = 2_000;

/// P13: how long the indexer rests once it holds every mail: what a search reads outside the
/// index (the tail stored since, scanned row by row) stays a fraction of a second of sends.
pub const INDEX_EVERY: Duration = Duration::from_millis(100);

/// P13: the mail the search index takes next — the sequence numbers after the last it holds,
/// `batch` at most, up to the newest stored — as `(after, through)`; None once it holds them all.
/// The index holds exactly the mail at or below its mark, so a search reads the rest directly.
pub fn index_due(indexed_through: i64, newest: i64, batch: i64) -> Option<(i64, i64)> {
    (newest > indexed_through).then(|| (indexed_through, newest.min(indexed_through.saturating_add(batch.max(1)))))
}

/// T14: a search's time, given how long it has been looking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub total: Duration,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { total: BUDGET }
    }
}

impl Budget {
    /// What is left after `elapsed`; None once it is spent.
    pub fn left(&self, elapsed: Duration) -> Option<Duration> {
        self.total.checked_sub(elapsed).filter(|d| !d.is_zero())
    }

    /// What is left as a database's statement timeout, in whole milliseconds and at least one
    /// (PostgreSQL reads 0 as no timeout at all); None once spent.
    pub fn timeout_ms(&self, elapsed: Duration) -> Option<u64> {
        self.left(elapsed).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1))
    }
}

/// What a scan of candidates kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan<K> {
    /// Keys of the candidates holding the text, in the candidates' order, at most `limit`.
    pub found: Vec<K>,
    /// T14: the scan stopped before it had looked at every candidate and before it had `limit`
    /// of them — everything in `found` holds the text, but more may.
    pub truncated: bool,
}

/// Keeps the first `limit` candidates with a field holding `needle`, asking `stop` before each
/// whether to stop here (the budget spent, the asker gone).
pub fn scan<K, E>(
    candidates: impl IntoIterator<Item = Result<(K, Vec<String>), E>>,
    needle: &Needle,
    limit: usize,
    mut stop: impl FnMut() -> bool,
) -> Result<Scan<K>, E> {
    let mut found = Vec::new();
    for candidate in candidates {
        if found.len() >= limit {
            break;
        }
        if stop() {
            return Ok(Scan { found, truncated: true });
        }
        let (key, fields) = candidate?;
        if fields.iter().any(|f| needle.found_in(f)) {
            found.push(key);
        }
    }
    Ok(Scan { found, truncated: false })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidates(fields: &[&str]) -> Vec<Result<(usize, Vec<String>), ()>> {
        fields.iter().enumerate().map(|(i, f)| Ok((i, vec![f.to_string()]))).collect()
    }

    #[test]
    fn t14_u5_a_needle_is_found_whatever_its_case_japanese_too() {
        assert!(Needle::new("INVOIC").found_in("Invoice for March"));
        assert!(Needle::new("請求").found_in("請求書の件"));
        assert!(Needle::new("ÉTÉ").found_in("un été"));
        assert!(!Needle::new("x_x").found_in("d_n 10% paid"));
        let zs = "Z".repeat(65_000);
        assert!(!Needle::new(&format!("{}Y", "Z".repeat(199))).found_in(&zs));
    }

    #[test]
    fn t14_trigrams_are_each_asked_once_and_none_below_three_characters() {
        assert_eq!(trigrams("請求"), Vec::<String>::new());
        assert_eq!(trigrams("abcd"), vec!["abc".to_string(), "bcd".to_string()]);
        assert_eq!(trigrams(&"Z".repeat(200)), vec!["ZZZ".to_string()]);
        assert_eq!(trigrams("abcABC"), vec!["abc".to_string(), "bcA".to_string(), "cAB".to_string()]);
    }

    #[test]
    fn p13_the_index_takes_a_batch_after_its_mark_and_nothing_once_caught_up() {
        assert_eq!(index_due(0, 0, 100), None);
        assert_eq!(index_due(50, 50, 100), None);
        assert_eq!(index_due(50, 40, 100), None, "mail below the mark is indexed as it is stored");
        assert_eq!(index_due(0, 30, 100), Some((0, 30)));
        assert_eq!(index_due(0, 1_000, 100), Some((0, 100)));
        assert_eq!(index_due(100, 1_000, 100), Some((100, 200)));
        assert_eq!(index_due(0, 5, 0), Some((0, 1)), "a batch takes at least one");
        assert_eq!(index_due(i64::MAX - 1, i64::MAX, 100), Some((i64::MAX - 1, i64::MAX)));
    }

    #[test]
    fn t14_a_budget_leaves_at_least_a_millisecond_and_nothing_once_spent() {
        let b = Budget::default();
        assert_eq!(b.left(Duration::ZERO), Some(BUDGET));
        assert_eq!(b.timeout_ms(Duration::from_millis(1_500)), Some(500));
        assert_eq!(b.timeout_ms(Duration::from_micros(1_999_500)), Some(1), "0 would be no timeout at all");
        assert_eq!(b.left(BUDGET), None);
        assert_eq!(b.timeout_ms(Duration::from_secs(3)), None);
    }

    #[test]
    fn t14_a_scan_stopped_early_is_truncated_and_keeps_what_it_found() {
        let fields = ["a hit", "miss", "a hit", "a hit"];
        let mut asked = 0;
        let s = scan(candidates(&fields), &Needle::new("HIT"), 10, || {
            asked += 1;
            asked > 3
        });
        assert_eq!(s, Ok(Scan { found: vec![0, 2], truncated: true }));
        let all = scan(candidates(&fields), &Needle::new("hit"), 10, || false);
        assert_eq!(all, Ok(Scan { found: vec![0, 2, 3], truncated: false }));
    }

    #[test]
    fn t14_a_scan_that_reached_its_limit_is_not_truncated() {
        let fields = ["hit", "hit", "hit"];
        let s = scan(candidates(&fields), &Needle::new("hit"), 2, || false);
        assert_eq!(s, Ok(Scan { found: vec![0, 1], truncated: false }));
        let spent_at_once = scan(candidates(&fields), &Needle::new("hit"), 2, || true);
        assert_eq!(spent_at_once, Ok(Scan { found: vec![], truncated: true }));
    }
}
