//! C3: a machine acts only as itself; the admin acts for anyone.

use super::Mail;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    Machine(String),
}

/// Status and contents: the sender and the recipient may see a mail, nobody else.
pub fn can_view(mail: &Mail, who: &Principal) -> bool {
    match who {
        Principal::Admin => true,
        Principal::Machine(m) => mail.to == *m || mail.from == *m,
    }
}

/// Moving a mail (seen, ack, reply, fail) is the recipient's business only.
pub fn can_move(mail: &Mail, who: &Principal) -> bool {
    match who {
        Principal::Admin => true,
        Principal::Machine(m) => mail.to == *m,
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::mail;
    use super::*;

    #[test]
    fn c3_a_machine_sees_only_mail_it_sent_or_received() {
        let m = mail("mail--00000001", "pc1", "pc2");
        assert!(can_view(&m, &Principal::Machine("pc1".into())));
        assert!(can_view(&m, &Principal::Machine("pc2".into())));
        assert!(!can_view(&m, &Principal::Machine("pc3".into())));
        assert!(can_view(&m, &Principal::Admin));
    }

    #[test]
    fn c3_only_the_recipient_moves_a_mail() {
        let m = mail("mail--00000001", "pc1", "pc2");
        assert!(can_move(&m, &Principal::Machine("pc2".into())));
        assert!(!can_move(&m, &Principal::Machine("pc1".into())));
        assert!(!can_move(&m, &Principal::Machine("pc3".into())));
    }
}
