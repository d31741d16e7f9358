//! K6: Claude Code's permission prompts relayed over pcmail's Telegram channel. Claude Code
//! sends `notifications/claude/channel/permission_request` to a channel server that declares
//! `claude/channel/permission`; the server asks the session owner's chat and sends back
//! `notifications/claude/channel/permission` with `{request_id, behavior}`. The rules: what the
//! question says, which answer in which chat is a verdict (T13: the owner's chat only), and that
//! a question nobody answered in time is denied.

use serde::Deserialize;

use crate::Ts;
use crate::present::cut;

/// The notification Claude Code sends when a tool call waits for a permission.
pub const REQUEST_METHOD: &str = "notifications/claude/channel/permission_request";
/// The notification that answers it.
pub const VERDICT_METHOD: &str = "notifications/claude/channel/permission";
/// The experimental capability that makes Claude Code relay its prompts to this server.
pub const CAPABILITY: &str = "claude/channel/permission";
/// How long a relayed prompt waits for its answer before pcmail denies it.
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// A permission prompt as Claude Code relays it. `request_id` is five lowercase letters
/// (a–z without `l`), matched without regard to case.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Request {
    pub request_id: String,
    pub tool_name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub input_preview: String,
}

crate::wire_enum! {
    /// How Claude Code is told to answer a permission request.
    pub enum Behavior as "permission behavior" {
        Allow = "allow",
        Deny = "deny",
    }
}

/// Whether `id` has the shape Claude Code gives request ids (so a stray word is never one).
pub fn is_request_id(id: &str) -> bool {
    id.len() == 5 && id.chars().all(|c| c.is_ascii_lowercase() && c != 'l')
}

/// The question sent to the owner's chat: what would run, and how to answer.
pub fn prompt(req: &Request, timeout_secs: u64) -> String {
    let id = req.request_id.to_ascii_lowercase();
    let mut text = format!("Claude Code asks to run {}", cut(&req.tool_name, 100));
    if !req.description.trim().is_empty() {
        text += &format!(": {}", cut(req.description.trim(), 300));
    }
    if !req.input_preview.trim().is_empty() {
        text += &format!("\n{}", cut(req.input_preview.trim(), 300));
    }
    text + &format!(
        "\n\nReply \"yes {id}\" to allow or \"no {id}\" to deny (denied after {timeout_secs} s unanswered)."
    )
}

/// A chat message that answers a prompt: `yes <id>` / `no <id>` (also `y`, `allow`, `n`,
/// `deny`; any case; nothing else in the message). Anything else is an ordinary message.
pub fn parse_answer(text: &str) -> Option<(Behavior, String)> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let [word, id] = words.as_slice() else { return None };
    let behavior = match word.to_ascii_lowercase().as_str() {
        "yes" | "y" | "allow" => Behavior::Allow,
        "no" | "n" | "deny" => Behavior::Deny,
        _ => return None,
    };
    let id = id.to_ascii_lowercase();
    is_request_id(&id).then_some((behavior, id))
}

/// A prompt asked and not yet answered.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Pending {
    pub request_id: String,
    /// The chat the question went to: the only one whose answer counts (T13).
    pub chat: i64,
    /// When it is denied unanswered.
    pub deadline: Ts,
}

/// K6/T13: what a message `text` from `chat` does to the prompts `pending`: the verdict on
/// one of them, only when it names that prompt's id and comes from the chat it was asked in.
/// An answer from any other chat, or naming no pending prompt, is no verdict.
pub fn verdict<'a>(pending: &'a [Pending], chat: i64, text: &str) -> Option<(&'a Pending, Behavior)> {
    let (behavior, id) = parse_answer(text)?;
    pending.iter().find(|p| p.request_id == id && p.chat == chat).map(|p| (p, behavior))
}

/// K6: the prompts no one answered by `now`: each is denied.
pub fn expired(pending: &[Pending], now: Ts) -> Vec<&Pending> {
    pending.iter().filter(|p| p.deadline <= now).collect()
}

/// K6/T13: the owner chat is outside `allowedChats`, so no prompt may go there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the owner chat {0} is not in the IntentPolicy's allowedChats (T13); add it there or change --owner-chat")]
pub struct ChatNotAllowed(pub i64);

/// K6/T13: where prompts are asked: the owner's chat, which `allowedChats` (when it lists any)
/// must let in. None: no relay (the prompt stays on the terminal alone).
pub fn relay_chat(owner_chat: Option<i64>, allowed_chats: &[i64]) -> Result<Option<i64>, ChatNotAllowed> {
    match owner_chat {
        None => Ok(None),
        Some(c) if allowed_chats.is_empty() || allowed_chats.contains(&c) => Ok(Some(c)),
        Some(c) => Err(ChatNotAllowed(c)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Ts {
        Ts::from_timestamp(1_700_000_000 + secs, 0).unwrap_or_default()
    }

    #[test]
    fn k6_an_answer_is_yes_or_no_and_a_request_id_nothing_else() {
        assert_eq!(parse_answer("yes tbxkq"), Some((Behavior::Allow, "tbxkq".into())));
        assert_eq!(parse_answer("  No  TBXKQ "), Some((Behavior::Deny, "tbxkq".into())));
        assert_eq!(parse_answer("y abcde"), Some((Behavior::Allow, "abcde".into())));
        assert_eq!(parse_answer("deny abcde"), Some((Behavior::Deny, "abcde".into())));
        for not in ["yes", "yes tbxkq please", "sure tbxkq", "yes tbxk", "yes tbxkl", "yes tb1kq", "yes tbxkqq", ""] {
            assert_eq!(parse_answer(not), None, "{not:?} is an ordinary message");
        }
    }

    #[test]
    fn t13_k6_only_the_chat_a_prompt_was_asked_in_answers_it() {
        let pending = vec![
            Pending { request_id: "abcde".into(), chat: 42, deadline: at(300) },
            Pending { request_id: "fghij".into(), chat: 42, deadline: at(300) },
        ];
        let (p, b) = verdict(&pending, 42, "no fghij").expect("the owner's answer");
        assert_eq!((p.request_id.as_str(), b), ("fghij", Behavior::Deny));
        assert_eq!(verdict(&pending, 7, "yes abcde"), None, "an answer from another chat does nothing");
        assert_eq!(verdict(&pending, 42, "yes zzzzz"), None, "no prompt of that id");
        assert_eq!(verdict(&pending, 42, "yes abcde, go"), None);
    }

    #[test]
    fn k6_a_prompt_unanswered_by_its_deadline_is_denied() {
        let pending = vec![
            Pending { request_id: "abcde".into(), chat: 1, deadline: at(300) },
            Pending { request_id: "fghij".into(), chat: 1, deadline: at(600) },
        ];
        assert!(expired(&pending, at(299)).is_empty());
        let due: Vec<&str> = expired(&pending, at(300)).iter().map(|p| p.request_id.as_str()).collect();
        assert_eq!(due, ["abcde"], "at its deadline, and only it");
        assert_eq!(expired(&pending, at(601)).len(), 2);
    }

    #[test]
    fn k6_the_prompt_names_the_tool_and_how_to_answer_and_the_relay_chat_is_an_allowed_one() {
        let req = Request {
            request_id: "AbCdE".into(),
            tool_name: "Bash".into(),
            description: "List files".into(),
            input_preview: "{\"command\":\"ls\"}".into(),
        };
        let text = prompt(&req, 300);
        assert!(text.starts_with("Claude Code asks to run Bash: List files\n{\"command\":\"ls\"}"), "{text}");
        assert!(text.contains("\"yes abcde\"") && text.contains("\"no abcde\"") && text.contains("300 s"), "{text}");
        let parsed: Request =
            serde_json::from_str(r#"{"request_id":"abcde","tool_name":"Bash"}"#).expect("description optional");
        assert_eq!(parsed.description, "");
        assert_eq!(relay_chat(None, &[1]), Ok(None));
        assert_eq!(relay_chat(Some(5), &[]), Ok(Some(5)));
        assert_eq!(relay_chat(Some(5), &[5, 6]), Ok(Some(5)));
        assert!(relay_chat(Some(5), &[6]).expect_err("outside allowedChats").to_string().contains("T13"));
    }
}
