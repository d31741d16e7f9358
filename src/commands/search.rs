//! `pcmail-ctl search` (U5): mail and ledger rows holding a text, as a table or structured.

use pcmail_agent::client::Client;
use pcmail_core::api::SearchResults;

use pcmail_core::search::Scope;

use crate::args::Output;
use crate::output::{self, cut};

pub async fn run(
    client: &Client,
    text: &str,
    within: Option<Scope>,
    limit: usize,
    output: Output,
) -> anyhow::Result<i32> {
    let mut query = vec![("q", text.to_string()), ("limit", limit.to_string())];
    query.extend(within.map(|w| ("in", w.to_string())));
    let found: SearchResults = client.get("/api/v1/search", &query).await?;
    if !output::structured(output, &found)? {
        let mail = found.mail.iter().map(|m| {
            vec![
                "mail".into(),
                m.id.clone(),
                format!("{} → {}", m.from, m.to),
                m.state.to_string(),
                cut(&m.subject, 60),
            ]
        });
        let rows = found.rows.iter().map(|r| {
            vec![
                "ledger".into(),
                format!("{}/{}", r.project, r.id),
                r.assignee.clone(),
                r.state.to_string(),
                cut(&r.task, 60),
            ]
        });
        output::table(&["IN", "ID", "WHO", "STATE", "TEXT"], &mail.chain(rows).collect::<Vec<_>>());
        if found.truncated {
            eprintln!("{}", pcmail_core::search::TRUNCATED);
        }
    }
    Ok(0)
}
