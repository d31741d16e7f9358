//! X5: `pcmail-ctl doctor` — one line a check of this PC's setup, exit 1 if any fails.

use anyhow::Context;
use pcmail_agent::client::{Client, home};
use pcmail_agent::doctor::{self, Setup};

use crate::args::{Connection, Output};

pub async fn run(conn: Connection, output: Output) -> anyhow::Result<i32> {
    let home = home();
    let overridden = conn.server.is_some() || conn.token.is_some();
    let client = Client::resolve(conn.server, conn.token, conn.as_machine, conn.ca.as_deref(), &home);
    // Claude Code's own directory, as it finds it.
    let claude = match std::env::var_os("CLAUDE_CONFIG_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => dir.into(),
        None => std::env::var_os("HOME")
            .or_else(|| std::env::var_os("USERPROFILE"))
            .map(std::path::PathBuf::from)
            .unwrap_or_default()
            .join(".claude"),
    };
    let setup = Setup {
        home,
        client,
        overridden,
        claude,
        project: std::env::current_dir().context("reading the working directory")?,
        exe: std::env::current_exe().context("finding this executable")?,
    };
    let findings = {
        // The MCP check writes to a server that may have ended unread (E10's default SIGPIPE
        // would end doctor then, printing nothing); the report itself ends quietly as E10 says.
        let _reported = crate::sigpipe::ChildPipesReported::now();
        doctor::run(&setup).await
    };
    let code = pcmail_core::doctor::exit_code(&findings);
    let report = serde_json::json!({ "kind": "Doctor", "healthy": code == 0, "checks": findings });
    if !crate::output::structured(output, &report)? {
        for finding in &findings {
            println!("{}", finding.line());
        }
    }
    Ok(code)
}
