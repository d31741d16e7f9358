//! Starting a detached poll from a hook (H1): the hook must return at once, and the poll must
//! outlive it and never hold the hook's terminal. The OS-specific options live here only.

use std::process::{Command, Stdio};

/// Makes `cmd` a detached background process on this OS.
pub fn detach(cmd: &mut Command) -> &mut Command {
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // A new process group: a signal to the hook's group (Claude Code killing a slow hook)
        // does not reach the poll.
        cmd.process_group(0);
    }
    #[cfg(windows)]
    {
        use std::os::windows::process::CommandExt;
        const DETACHED_PROCESS: u32 = 0x0000_0008;
        const CREATE_NEW_PROCESS_GROUP: u32 = 0x0000_0200;
        const CREATE_NO_WINDOW: u32 = 0x0800_0000;
        cmd.creation_flags(DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP | CREATE_NO_WINDOW);
    }
    cmd
}

/// Starts `pcmail-ctl poll --quiet` in the background, with this process's environment.
pub fn spawn_poll() -> std::io::Result<()> {
    let exe = std::env::current_exe()?;
    detach(Command::new(exe).args(["poll", "--quiet"])).spawn().map(|_| ())
}
