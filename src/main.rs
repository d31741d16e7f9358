//! `pcmail-ctl`: one binary for the controller (`serve`), kubectl-style admin verbs and the
//! client verbs every PC uses. This file is the edge: parse, dispatch, map errors to exit codes.

mod args;
mod commands;
mod exit;
mod logging;
mod output;
mod progress;
mod sigpipe;

use clap::Parser;

/// P14: see the workspace's Cargo.toml; the library crates leave the allocator to the binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut cli = args::Cli::parse();
    // E10: a variable set but empty (`PCMAIL_TOKEN=`) is unset, so the login's value applies.
    for value in [&mut cli.conn.server, &mut cli.conn.token, &mut cli.conn.as_machine] {
        value.take_if(|v| v.trim().is_empty());
    }
    sigpipe::quiet_on_closed_output(&cli.command);
    // Hooks run on every prompt and tool call: no async runtime, no threads, just the cache.
    if let args::Command::Hook { event } = &cli.command {
        std::process::exit(commands::hook(event));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            exit::print(&err);
            std::process::exit(exit::exit_code(&err));
        }
    }
}
