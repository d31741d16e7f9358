//! E10: what SIGPIPE does to each verb — ends it quietly when its own output closes, and is an
//! error to report while it writes to a child that may be gone.

/// E10: a verb whose output is closed (`| head`) ends quietly, as Unix tools do, instead of
/// panicking on the broken pipe. Not `serve` and `worker`: they write to their Functions' stdin,
/// where a reader that went away is an error to report, not a reason to die (doctor's checks,
/// which write to the MCP server they start, hold [`ChildPipesReported`] for the same reason).
pub fn quiet_on_closed_output(command: &crate::args::Command) {
    #[cfg(unix)]
    if !matches!(command, crate::args::Command::Serve(_) | crate::args::Command::Worker { .. }) {
        // SAFETY: restores the default action of one signal before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    #[cfg(not(unix))]
    let _ = command;
}

/// E10's exception while held (doctor's checks): a verb's write into a child that went away
/// is an error it reports, not the end of the verb. SIGPIPE is ignored, and on drop it is as
/// it was again.
pub struct ChildPipesReported {
    #[cfg(unix)]
    before: libc::sighandler_t,
}

impl ChildPipesReported {
    pub fn now() -> ChildPipesReported {
        ChildPipesReported {
            // SAFETY: sets one signal's disposition (sigaction is process-wide and
            // thread-safe); no handler of ours is installed.
            #[cfg(unix)]
            before: unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) },
        }
    }
}

impl Drop for ChildPipesReported {
    fn drop(&mut self) {
        // SAFETY: as in `now`; `before` is the disposition `signal` answered there.
        #[cfg(unix)]
        unsafe {
            libc::signal(libc::SIGPIPE, self.before);
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(unix)]
    use super::ChildPipesReported;

    #[cfg(unix)]
    fn sigpipe_now() -> libc::sighandler_t {
        // SAFETY: reads the disposition (a null new action changes nothing).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old);
            old.sa_sigaction
        }
    }

    /// E10/X5: under E10's default a write into a pipe nobody reads would end the process; while
    /// the guard is held it is an EPIPE error, and the default is back once it is dropped.
    #[cfg(unix)]
    #[test]
    fn e10_x5_a_write_to_a_child_gone_is_an_error_while_pipes_are_reported() {
        let mut ends = [0; 2];
        // SAFETY: a fresh pipe; its read end closed at once, so nothing ever reads it.
        assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
        unsafe { libc::close(ends[0]) };
        // SAFETY: as `quiet_on_closed_output` does; put back as the test harness had it below.
        let harness = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let written = {
            let _reported = ChildPipesReported::now();
            assert_eq!(sigpipe_now(), libc::SIG_IGN);
            // SAFETY: one byte from a live buffer into the pipe's open write end.
            unsafe { libc::write(ends[1], b"x".as_ptr().cast(), 1) }
        };
        let error = std::io::Error::last_os_error();
        assert_eq!(sigpipe_now(), libc::SIG_DFL, "E10's default again");
        unsafe {
            libc::signal(libc::SIGPIPE, harness);
            libc::close(ends[1]);
        }
        assert_eq!((written, error.raw_os_error()), (-1, Some(libc::EPIPE)));
    }
}
