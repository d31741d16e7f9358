//! R4: the error of reading a name of the model — a mail state or kind, an alert kind or state,
//! a job or ledger row state — that is none of its own. One type for every such enum's `FromStr`,
//! so a caller can name what was wrong without a bare `String`.

/// `given` is not a name of `what`; `known` says which are (`; one of new, delivered, …`, or empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}{known}")]
pub struct UnknownName {
    pub what: &'static str,
    pub given: String,
    known: String,
}

impl UnknownName {
    /// `known` is printed after the name as it is: `"; one of a, b"`, or `""` for none.
    pub fn new(what: &'static str, given: &str, known: impl Into<String>) -> Self {
        UnknownName { what, given: given.to_string(), known: known.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r4_an_unknown_name_says_what_it_is_not_and_what_is() {
        let e = UnknownName::new("mail state", "sent", "; one of new, delivered");
        assert_eq!(e.to_string(), "unknown mail state \"sent\"; one of new, delivered");
        assert_eq!(UnknownName::new("alert kind", "x", "").to_string(), "unknown alert kind \"x\"");
    }
}
