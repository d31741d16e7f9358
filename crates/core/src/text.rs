//! T6: what a name and a text may be. Names are lowercase DNS labels, so they are safe in URLs,
//! file names, spreadsheet tabs and metric labels (a name is a label value, and a label's
//! values stay as many as the specs declare). Texts refuse NUL, which truncates them in C
//! tools and some stores, and bidirectional overrides, which make a text read differently from
//! what it holds (`U+202E` turns `exe.txt` into `txt.exe`). A one-line text (a subject, a
//! sender's name) refuses line breaks and control characters too.

use std::fmt;

/// A name's longest form (a DNS label's).
pub const MAX_NAME: usize = 63;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error(
        "{0:?} is not a valid name: use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit"
    )]
    Name(String),
    #[error("contains {0} at character {1}: NUL and bidirectional overrides are refused")]
    Refused(CharName, usize),
    #[error("must be one line, but contains {0} at character {1}")]
    NotOneLine(CharName, usize),
}

/// A character as an error names it: `U+202E`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CharName(pub char);

impl fmt::Display for CharName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "U+{:04X}", u32::from(self.0))
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= MAX_NAME
        && b.first().is_some_and(inner)
        && b.last().is_some_and(inner)
        && b.iter().all(|c| inner(c) || *c == b'-')
}

pub fn check_name(s: &str) -> Result<(), TextError> {
    if is_name(s) { Ok(()) } else { Err(TextError::Name(s.to_string())) }
}

/// NUL, and the bidirectional embeddings, overrides and isolates (U+202A–202E, U+2066–2069).
fn is_refused(c: char) -> bool {
    matches!(c, '\0' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Line and paragraph breaks and control characters: a one-line text has none.
fn breaks_line(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

/// A text of any length and lines: refuses NUL and bidirectional overrides.
pub fn check_text(s: &str) -> Result<(), TextError> {
    match s.chars().enumerate().find(|(_, c)| is_refused(*c)) {
        Some((at, c)) => Err(TextError::Refused(CharName(c), at + 1)),
        None => Ok(()),
    }
}

/// A one-line text: [`check_text`], and no line break or control character (a tab included).
pub fn check_line(s: &str) -> Result<(), TextError> {
    check_text(s)?;
    match s.chars().enumerate().find(|(_, c)| breaks_line(*c)) {
        Some((at, c)) => Err(TextError::NotOneLine(CharName(c), at + 1)),
        None => Ok(()),
    }
}

/// A text pcmail did not write and cannot refuse (a Function's output): each refused
/// character becomes U+FFFD, so it is stored and shown without its effect.
pub fn sanitize(s: &str) -> String {
    if check_text(s).is_ok() {
        return s.to_string();
    }
    s.chars().map(|c| if is_refused(c) { '\u{FFFD}' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t6_names_are_lowercase_dns_labels() {
        for good in ["a", "desk", "pc-1", "0", "a".repeat(63).as_str(), "x9-y"] {
            assert!(is_name(good), "{good:?}");
        }
        for bad in [
            "",
            "Desk",
            "-a",
            "a-",
            "a_b",
            "a.b",
            "a b",
            "a/b",
            "a?b",
            "a#b",
            "ｄｅｓｋ",
            "デスク",
            "a\u{202E}",
            "a\0",
            "<b>x</b>",
            "a".repeat(64).as_str(),
        ] {
            assert!(!is_name(bad), "{bad:?}");
            assert!(check_name(bad).unwrap_err().to_string().contains("not a valid name"));
        }
    }

    #[test]
    fn t6_text_refuses_nul_and_bidi_overrides_and_names_them() {
        assert_eq!(check_text("複数行\nok\ttab"), Ok(()));
        for (text, c, at) in [
            ("a\0b", '\0', 2),
            ("x\u{202A}", '\u{202A}', 2),
            ("\u{202E}gnp.exe", '\u{202E}', 1),
            ("ab\u{2066}", '\u{2066}', 3),
            ("\u{2069}", '\u{2069}', 1),
        ] {
            let e = check_text(text).expect_err(text);
            assert_eq!(e, TextError::Refused(CharName(c), at));
        }
        assert!(check_text("\u{202E}").unwrap_err().to_string().contains("U+202E at character 1"));
        // Marks that only hint a direction (LRM, RLM) are not overrides.
        assert_eq!(check_text("a\u{200E}b\u{200F}"), Ok(()));
    }

    #[test]
    fn t6_a_one_line_text_refuses_every_line_break() {
        assert_eq!(check_line("請求書 #12 — ok"), Ok(()));
        for (text, c) in [("a\nb", '\n'), ("a\rb", '\r'), ("a\u{2028}b", '\u{2028}'), ("a\u{85}b", '\u{85}')] {
            assert_eq!(check_line(text), Err(TextError::NotOneLine(CharName(c), 2)), "{text:?}");
        }
        assert_eq!(check_line("a\u{2029}"), Err(TextError::NotOneLine(CharName('\u{2029}'), 2)));
        assert_eq!(check_line("\u{1b}[31m"), Err(TextError::NotOneLine(CharName('\u{1b}'), 1)));
        assert!(matches!(check_line("a\0"), Err(TextError::Refused(..))), "NUL is named as refused first");
    }

    #[test]
    fn t6_sanitize_defuses_what_check_text_refuses_and_keeps_the_rest() {
        assert_eq!(sanitize("ok\n"), "ok\n");
        let s = sanitize("a\0b\u{202E}c");
        assert_eq!(s, "a\u{FFFD}b\u{FFFD}c");
        assert_eq!(check_text(&s), Ok(()));
    }
}
