//! How `loopd` ends: one exit status per kind of end, the table in docs/loopd.md ("Exit
//! status") and at the end of `loopd --help` ([`TABLE`]).

use std::process::ExitCode;

/// The exit statuses, as `loopd --help` prints them.
pub const TABLE: &str = "\
Exit status:
  0    completed: the command did what it says (a request: it completed)
  1    failed: a request failed, a self-test check failed, the server answered with an error
  2    usage: the command line or the config was refused (the key is named), or the daemon
       refused what it asked for (UNKNOWN_TOOL, LINE_TOO_LONG)
  3    refused: the request was not taken (NO_SLOT_AVAILABLE, WORKER_NOT_READY, WORKER_FAILED,
       WORKER_STOPPED, NO_THREAD, SHUTTING_DOWN, STORE_FULL, TOO_MANY_CONNECTIONS)
  4    not found: no such request (never submitted, fetched already, or dropped)
  5    pending: the request is still running
  6    unreachable: nothing answers on the daemon's or the server's socket (the path is named)
  130  interrupted (Ctrl-C) while following a request: it goes on; the hint names `loopd follow`
  141  stdout was closed before everything was written (`| head`): nothing more is said";

/// One kind of end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The command did what it says.
    Completed,
    /// A request or a check failed, or the server answered with an error.
    Failed,
    /// The command line or the config was refused.
    Usage,
    /// The request was not taken.
    Refused,
    /// No such request.
    NotFound,
    /// The request is still running.
    Pending,
    /// Nothing answers on a socket the command needs.
    Unreachable,
    /// SIGINT while a request was followed: 128 + SIGINT, as a shell reports it.
    Interrupted,
    /// stdout was closed under the command: 128 + SIGPIPE, what a shell reports for `cat` or
    /// `yes` cut off by `| head`, so `set -o pipefail` still sees that the output was cut short.
    StdoutClosed,
}

impl Exit {
    /// The status the process exits with.
    pub const fn code(self) -> u8 {
        match self {
            Exit::Completed => 0,
            Exit::Failed => 1,
            Exit::Usage => 2,
            Exit::Refused => 3,
            Exit::NotFound => 4,
            Exit::Pending => 5,
            Exit::Unreachable => 6,
            Exit::Interrupted => 130,
            Exit::StdoutClosed => 141,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

/// A command that did not get to its end: how it exits and the line that says why (empty:
/// nothing to say, as for a closed stdout).
#[derive(Debug)]
pub struct Fail {
    /// The exit status.
    pub exit: Exit,
    /// Why, in one line, printed after `loopd <command>: `.
    pub why: String,
}

impl Fail {
    /// A failure of kind `exit`, saying `why`.
    pub fn new(exit: Exit, why: impl Into<String>) -> Fail {
        Fail {
            exit,
            why: why.into(),
        }
    }
}

impl From<std::io::Error> for Fail {
    /// A write to stdout that failed: a closed pipe ends quietly, anything else is said.
    fn from(e: std::io::Error) -> Fail {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Fail::new(Exit::StdoutClosed, "")
        } else {
            Fail::new(Exit::Failed, format!("writing to stdout: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_is_distinct_and_in_the_table() {
        let all = [
            Exit::Completed,
            Exit::Failed,
            Exit::Usage,
            Exit::Refused,
            Exit::NotFound,
            Exit::Pending,
            Exit::Unreachable,
            Exit::Interrupted,
            Exit::StdoutClosed,
        ];
        let mut codes: Vec<u8> = all.iter().map(|e| e.code()).collect();
        codes.dedup();
        assert_eq!(codes, [0, 1, 2, 3, 4, 5, 6, 130, 141]);
        for c in codes {
            assert!(TABLE.contains(&format!("\n  {c:<4} ")), "{c}");
        }
    }

    #[test]
    fn a_closed_pipe_is_quiet_and_other_write_errors_are_said() {
        let f = Fail::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!((f.exit, f.why.as_str()), (Exit::StdoutClosed, ""));
        let f = Fail::from(std::io::Error::other("disk full"));
        assert_eq!(
            (f.exit, f.why.as_str()),
            (Exit::Failed, "writing to stdout: disk full")
        );
    }
}
