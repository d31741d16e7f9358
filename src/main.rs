//! `pcmail-ctl`: one binary for the controller (`serve`), kubectl-style admin verbs and the
//! client verbs every PC uses. This file is the edge: parse, dispatch, map errors to exit codes.

mod args;
mod commands;
mod exit;
mod logging;
mod output;
mod progress;

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
    quiet_on_closed_output(&cli.command);
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

/// E10: a verb whose output is closed (`| head`) ends quietly, as Unix tools do, instead of
/// panicking on the broken pipe. Not `serve` and `worker`: they write to their Functions' stdin,
/// where a reader that went away is an error to report, not a reason to die.
fn quiet_on_closed_output(command: &args::Command) {
    #[cfg(unix)]
    if !matches!(command, args::Command::Serve(_) | args::Command::Worker { .. }) {
        // SAFETY: restores the default action of one signal before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    #[cfg(not(unix))]
    let _ = command;
}

/// While held, a verb's write into a child that went away is an error it reports, not the end
/// of the verb: SIGPIPE ignored, and back to E10's default on drop.
pub struct ChildPipesReported(());

impl ChildPipesReported {
    pub fn now() -> ChildPipesReported {
        set_sigpipe(true);
        ChildPipesReported(())
    }
}

impl Drop for ChildPipesReported {
    fn drop(&mut self) {
        set_sigpipe(false);
    }
}

fn set_sigpipe(ignored: bool) {
    // SAFETY: sets one signal's disposition (sigaction is process-wide and thread-safe); no
    // handler of ours is installed.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, if ignored { libc::SIG_IGN } else { libc::SIG_DFL });
    }
    #[cfg(not(unix))]
    let _ = ignored;
}
