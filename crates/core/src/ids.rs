//! Mail ids (M4, M6), intent ids (I1, T10) and the hex helpers they share with token hashing.
//!
//! Two namespaces (T10): `mail--` ids a client may choose, and `intent--` ids only the server
//! and the PC derive from a chat message's key. A sender can therefore never take the id a
//! future Telegram message will need.

use sha2::{Digest, Sha256};

const MAIL_PREFIX: &str = "mail--";
const INTENT_PREFIX: &str = "intent--";
/// T10: how many hex digits a client-chosen mail id may carry.
const MAIL_HEX: std::ops::RangeInclusive<usize> = 8..=32;
const INTENT_HEX: usize = 16;

/// M4: `mail--` + 8 random lowercase hex digits, from 4 random bytes the caller drew.
pub fn mail_id(random: [u8; 4]) -> String {
    format!("{MAIL_PREFIX}{}", hex(&random))
}

/// How many random ids a send draws: 32 random bits, among a million stored mails, are taken
/// once in about 4,300 draws, and a new mail must never be refused for the server's own pick.
pub const DRAWS: usize = 4;

/// M4: of the ids drawn for a send, the first no mail holds (the last when all are taken,
/// which the send then refuses as a duplicate).
pub fn first_free(drawn: &[String], taken: impl Fn(&str) -> bool) -> &str {
    drawn.iter().find(|id| !taken(id)).or(drawn.last()).map_or("", String::as_str)
}

/// M6: a reply's id is fixed by its parent and sender, so re-sending the same reply is idempotent.
pub fn reply_id(parent_id: &str, sender: &str) -> String {
    let digest = Sha256::digest(format!("{parent_id}:{sender}").as_bytes());
    format!("{MAIL_PREFIX}{}", &hex(&digest)[..8])
}

/// I1/T10: an intent's id follows from its key, so recording it twice, on the PC or on the
/// server, is the same row; its prefix is one no client may send under.
pub fn intent_id(key: &str) -> String {
    format!("{INTENT_PREFIX}{}", &sha256_hex(key)[..INTENT_HEX])
}

/// The id an intent got before T10 (`mail--` + 8 hex of the same digest), so a store written
/// then still finds its intents when a message is recorded again.
pub fn legacy_intent_id(key: &str) -> String {
    format!("{MAIL_PREFIX}{}", &sha256_hex(key)[..8])
}

fn lower_hex(h: &str) -> bool {
    h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// T10: an id a client may choose for its mail (`mail--` and 8–32 lowercase hex; M4 draws 8).
pub fn is_mail_id(id: &str) -> bool {
    id.strip_prefix(MAIL_PREFIX).is_some_and(|h| MAIL_HEX.contains(&h.len()) && lower_hex(h))
}

pub fn is_intent_id(id: &str) -> bool {
    id.strip_prefix(INTENT_PREFIX).is_some_and(|h| h.len() == INTENT_HEX && lower_hex(h))
}

/// Any id a stored mail may have: a client's or a derived intent's (routes that read or move
/// mail take both).
pub fn is_stored_id(id: &str) -> bool {
    is_mail_id(id) || is_intent_id(id)
}

/// What [`is_mail_id`] asks, in the words an error gives.
pub const MAIL_ID_SHAPE: &str = "mail-- followed by 8 to 32 lowercase hex digits";

pub fn hex(bytes: &[u8]) -> String {
    // P10: by table, not `write!` a byte (every job id, token hash and response).
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// SHA-256 of a secret, hex; tokens are stored only in this form.
pub fn sha256_hex(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m4_a_drawn_id_a_mail_already_holds_is_passed_over_for_the_next() {
        let drawn: Vec<String> = [[1, 0, 0, 0], [2, 0, 0, 0], [3, 0, 0, 0]].map(mail_id).to_vec();
        assert_eq!(first_free(&drawn, |_| false), drawn[0]);
        assert_eq!(first_free(&drawn, |id| id == drawn[0]), drawn[1]);
        assert_eq!(first_free(&drawn, |id| id != drawn[2]), drawn[2]);
        assert_eq!(first_free(&drawn, |_| true), drawn[2], "all taken: the last, refused by the send");
        assert_eq!(first_free(&[], |_| false), "");
    }

    #[test]
    fn m4_hex_is_two_lowercase_digits_a_byte_high_nibble_first() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xf0, 0xff]), "000fa5f0ff");
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn m4_mail_ids_are_prefix_and_eight_lowercase_hex() {
        let id = mail_id([0xde, 0xad, 0xBE, 0x01]);
        assert_eq!(id, "mail--deadbe01");
        assert!(is_mail_id(&id));
        for bad in ["mail--DEADBE01", "mail--deadbe0", "mail-deadbe01", "mail--deadbe0g", ""] {
            assert!(!is_mail_id(bad), "{bad}");
        }
        assert!(is_mail_id(&format!("mail--{}", "a".repeat(32))));
        assert!(!is_mail_id(&format!("mail--{}", "a".repeat(33))));
    }

    #[test]
    fn t10_intent_ids_live_outside_what_a_client_may_choose() {
        let id = intent_id("telegram--100123-557");
        assert!(id.starts_with("intent--") && is_intent_id(&id) && is_stored_id(&id), "{id}");
        assert!(!is_mail_id(&id), "a sender could squat {id}");
        assert_ne!(intent_id("telegram--100123-557"), intent_id("telegram--100123-558"));
        // No client-choosable id is ever an intent's.
        for n in MAIL_HEX {
            assert!(!is_intent_id(&format!("mail--{}", "0".repeat(n))));
        }
    }

    #[test]
    fn m6_reply_id_is_first_8_hex_of_sha256_parent_colon_sender() {
        // `printf 'mail--00000001:pc2' | sha256sum` starts with 72de21c0.
        assert_eq!(reply_id("mail--00000001", "pc2"), "mail--72de21c0");
        assert_ne!(reply_id("mail--00000001", "pc2"), reply_id("mail--00000001", "pc3"));
        assert!(is_mail_id(&reply_id("mail--00000001", "pc2")));
    }
}
