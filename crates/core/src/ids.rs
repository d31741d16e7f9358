//! Mail ids (M4, M6) and the hex helpers they share with token hashing.

use sha2::{Digest, Sha256};

const MAIL_PREFIX: &str = "mail--";

/// M4: `mail--` + 8 random lowercase hex digits, from 4 random bytes the caller drew.
pub fn mail_id(random: [u8; 4]) -> String {
    format!("{MAIL_PREFIX}{}", hex(&random))
}

/// M6: a reply's id is fixed by its parent and sender, so re-sending the same reply is idempotent.
pub fn reply_id(parent_id: &str, sender: &str) -> String {
    let digest = Sha256::digest(format!("{parent_id}:{sender}").as_bytes());
    format!("{MAIL_PREFIX}{}", &hex(&digest)[..8])
}

/// Whether `id` has the shape of M4; anything else is refused at the API's edge.
pub fn is_mail_id(id: &str) -> bool {
    id.strip_prefix(MAIL_PREFIX)
        .is_some_and(|h| h.len() == 8 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// SHA-256 of a secret, hex; tokens are stored only in this form.
pub fn sha256_hex(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m4_mail_ids_are_prefix_and_eight_lowercase_hex() {
        let id = mail_id([0xde, 0xad, 0xBE, 0x01]);
        assert_eq!(id, "mail--deadbe01");
        assert!(is_mail_id(&id));
        for bad in ["mail--DEADBE01", "mail--deadbe0", "mail-deadbe01", "mail--deadbe0g", ""] {
            assert!(!is_mail_id(bad), "{bad}");
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
