//! The command line: `--listen <socket path> --upstream <host:port> [--socket-mode 0600|0660]`,
//! `--help`, `--version`.
//!
//! Promise: parsing reads nothing but the arguments it is given; every rejection names the
//! argument that was wrong, in one line. The grammar and the help text are clap's (derive);
//! clap's errors are mapped onto [`ArgError`] so the one-line messages stay ours.

use core::fmt;
use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, Parser};

use crate::listen::Mode;

/// Longest `--listen` path in bytes: `sun_path` holds 107 plus a NUL, and the socket is first
/// bound under the same name plus [`crate::listen::STAGING_SUFFIX`] (4 bytes).
pub const MAX_LISTEN_PATH: usize = 103;

/// What clap parses: both flags optional here so that a missing one is reported by
/// [`parse`] in our words, after every other mistake.
#[derive(Parser, Debug)]
#[command(
    name = "inferproxy",
    version,
    about = "Forwards each connection on a Unix socket to one TCP upstream, byte for byte.\n\
             At most 8 connections at a time; accepts limited to a burst of 10, then 2 per second.\n\
             No config file; nothing about the traffic is logged.",
    override_usage = "inferproxy --listen <socket path> --upstream <host:port> [--socket-mode 0600|0660]",
    help_template = "usage: {usage}\n\n{about}\n\n{all-args}\n"
)]
struct Cli {
    /// Unix socket to create (mode 0600, see --socket-mode); a stale socket there is replaced
    // An OsString, not a PathBuf: clap's path parser rejects an empty value before we can
    // say that the path is empty.
    #[arg(long, value_name = "path")]
    listen: Option<OsString>,
    /// TCP address to forward to, e.g. 127.0.0.1:8080 or [::1]:8080
    #[arg(long, value_name = "host:port")]
    upstream: Option<String>,
    /// 0600: only this user may connect; 0660: this user's primary group too (a loopd of
    /// another user in that group) [default: 0600]
    #[arg(long, value_name = "mode")]
    socket_mode: Option<String>,
}

/// The help text printed by `--help`.
pub fn help() -> String {
    Cli::command().render_help().to_string()
}

/// What the process was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Forward connections.
    Run(Config),
    /// Print [`help`] and exit 0.
    Help,
    /// Print the version and exit 0.
    Version,
}

/// The forwarder's whole configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Path of the Unix socket to listen on.
    pub listen: PathBuf,
    /// `host:port`, resolved again for each connection so a moved upstream is followed.
    pub upstream: String,
    /// Who may connect to the socket (0600 unless `--socket-mode 0660`).
    pub socket_mode: Mode,
}

/// Why the command line was rejected. Each names the argument.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArgError {
    /// An argument that is not one of ours (shown lossily if not UTF-8).
    Unknown(String),
    /// A flag that needs a value came last.
    MissingValue(&'static str),
    /// A flag given twice.
    Repeated(&'static str),
    /// A required flag not given.
    Missing(&'static str),
    /// `--listen` empty or longer than [`MAX_LISTEN_PATH`] bytes (length given).
    ListenPath(usize),
    /// `--upstream` not of the form `host:port` with a port from 1 to 65535.
    Upstream(String),
    /// `--socket-mode` neither 0600 nor 0660 (the value given).
    SocketMode(String),
    /// Any other rejection by the parser, in its own first line.
    Other(String),
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(arg) => write!(f, "unknown argument `{arg}` (see --help)"),
            Self::MissingValue(flag) => write!(f, "{flag} needs a value"),
            Self::Repeated(flag) => write!(f, "{flag} given more than once"),
            Self::Missing(flag) => write!(f, "{flag} is required (see --help)"),
            Self::ListenPath(0) => write!(f, "--listen path is empty"),
            Self::ListenPath(len) => write!(
                f,
                "--listen path is {len} bytes, longer than {MAX_LISTEN_PATH}"
            ),
            Self::Upstream(value) => write!(
                f,
                "--upstream `{value}` is not host:port with a port from 1 to 65535"
            ),
            Self::SocketMode(value) => {
                write!(f, "--socket-mode `{value}` is not 0600 or 0660")
            }
            Self::Other(line) => write!(f, "{line} (see --help)"),
        }
    }
}

impl core::error::Error for ArgError {}

/// Parses the arguments after the program name. `--help` and `--version` win wherever they are.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, ArgError> {
    let args: Vec<OsString> = args.into_iter().collect();
    let argv = core::iter::once(OsString::from("inferproxy")).chain(args.iter().cloned());
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => {
            // clap stops at the first mistake; a `--help` after it still wins, as it always has.
            let asked = |names: [&str; 2]| args.iter().any(|a| names.iter().any(|n| a == *n));
            return match e.kind() {
                ErrorKind::DisplayHelp => Ok(Command::Help),
                ErrorKind::DisplayVersion => Ok(Command::Version),
                _ if asked(["--help", "-h"]) => Ok(Command::Help),
                _ if asked(["--version", "-V"]) => Ok(Command::Version),
                _ => Err(arg_error(&e)),
            };
        }
    };
    let listen = PathBuf::from(cli.listen.ok_or(ArgError::Missing("--listen"))?);
    let len = listen.as_os_str().len();
    if len == 0 || len > MAX_LISTEN_PATH {
        return Err(ArgError::ListenPath(len));
    }
    let upstream = cli.upstream.ok_or(ArgError::Missing("--upstream"))?;
    if !is_host_port(&upstream) {
        return Err(ArgError::Upstream(upstream));
    }
    let socket_mode = match cli.socket_mode {
        None => Mode::Owner,
        Some(m) => m.parse().map_err(|_| ArgError::SocketMode(m))?,
    };
    Ok(Command::Run(Config {
        listen,
        upstream,
        socket_mode,
    }))
}

/// Our flag named in a clap error's context (clap writes it as `--listen <path>`).
fn flag_of(e: &clap::Error) -> Option<&'static str> {
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    ["--listen", "--upstream", "--socket-mode"]
        .into_iter()
        .find(|f| arg.split(' ').next() == Some(*f))
}

/// A clap error in our words.
fn arg_error(e: &clap::Error) -> ArgError {
    match (e.kind(), flag_of(e)) {
        (ErrorKind::UnknownArgument, _) => match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(arg)) => ArgError::Unknown(arg.clone()),
            _ => other(e),
        },
        (ErrorKind::InvalidValue, Some(flag)) => ArgError::MissingValue(flag),
        (ErrorKind::ArgumentConflict, Some(flag)) => ArgError::Repeated(flag),
        _ => other(e),
    }
}

/// clap's own first line, without its `error: ` prefix.
fn other(e: &clap::Error) -> ArgError {
    let text = e.render().to_string();
    let line = text.lines().next().unwrap_or_default();
    ArgError::Other(line.trim_start_matches("error: ").to_owned())
}

/// `host:port` where host is a name, an IPv4 address or a bracketed IPv6 address.
fn is_host_port(s: &str) -> bool {
    let Some((host, port)) = s.rsplit_once(':') else {
        return false;
    };
    let port_ok = !port.starts_with('+') && matches!(port.parse::<u16>(), Ok(p) if p != 0);
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
        }
    };
    port_ok && host_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, ArgError> {
        parse(args.iter().map(OsString::from))
    }

    fn run(listen: &str, upstream: &str) -> Command {
        Command::Run(Config {
            listen: PathBuf::from(listen),
            upstream: upstream.to_owned(),
            socket_mode: Mode::Owner,
        })
    }

    #[test]
    fn both_flags_in_either_order() {
        let want = run("/run/x/infer.sock", "straylight:11434");
        let a = [
            "--listen",
            "/run/x/infer.sock",
            "--upstream",
            "straylight:11434",
        ];
        assert_eq!(p(&a), Ok(want.clone()));
        let b = [
            "--upstream",
            "straylight:11434",
            "--listen",
            "/run/x/infer.sock",
        ];
        assert_eq!(p(&b), Ok(want));
    }

    #[test]
    fn socket_mode_0660_or_0600_only() {
        let base = ["--listen", "/run/x/infer.sock", "--upstream", "h:1"];
        let with = |mode: &str| {
            let mut a = base.to_vec();
            a.extend(["--socket-mode", mode]);
            p(&a)
        };
        let Ok(Command::Run(c)) = with("0660") else {
            panic!("0660 refused")
        };
        assert_eq!(c.socket_mode, Mode::Group);
        let Ok(Command::Run(c)) = with("0600") else {
            panic!("0600 refused")
        };
        assert_eq!(c.socket_mode, Mode::Owner);
        assert_eq!(p(&base), Ok(run("/run/x/infer.sock", "h:1")));
        assert_eq!(with("0666"), Err(ArgError::SocketMode("0666".into())));
        assert_eq!(
            with("0666").unwrap_err().to_string(),
            "--socket-mode `0666` is not 0600 or 0660"
        );
    }

    #[test]
    fn help_and_version_win() {
        assert_eq!(p(&["--help"]), Ok(Command::Help));
        assert_eq!(p(&["--bogus", "--help"]), Ok(Command::Help));
        assert_eq!(p(&["--version"]), Ok(Command::Version));
        assert_eq!(p(&["-V"]), Ok(Command::Version));
    }

    #[test]
    fn rejections_name_the_argument() {
        let cases: &[(&[&str], &str)] = &[
            (&["--bogus"], "unknown argument `--bogus` (see --help)"),
            (&["--listen"], "--listen needs a value"),
            (&["--listen", "a", "--upstream"], "--upstream needs a value"),
            (
                &["--listen", "a", "--listen", "b"],
                "--listen given more than once",
            ),
            (&["--upstream", "h:1"], "--listen is required (see --help)"),
            (&["--listen", "a"], "--upstream is required (see --help)"),
            (
                &["--listen", "a", "--upstream", "h:1", "--socket-mode"],
                "--socket-mode needs a value",
            ),
            (
                &["--listen", "", "--upstream", "h:1"],
                "--listen path is empty",
            ),
            (
                &["--listen", "a", "--upstream", "h"],
                "--upstream `h` is not host:port with a port from 1 to 65535",
            ),
        ];
        for (args, want) in cases {
            let err = p(args).expect_err(want);
            assert_eq!(err.to_string(), *want, "{args:?}");
        }
    }

    #[test]
    fn first_mistake_is_reported() {
        assert_eq!(p(&["--x", "--y"]), Err(ArgError::Unknown("--x".to_owned())));
    }

    #[test]
    fn listen_path_at_and_past_the_limit() {
        let at = "a".repeat(MAX_LISTEN_PATH);
        assert!(matches!(
            p(&["--listen", &at, "--upstream", "h:1"]),
            Ok(Command::Run(_))
        ));
        let past = "a".repeat(MAX_LISTEN_PATH + 1);
        assert_eq!(
            p(&["--listen", &past, "--upstream", "h:1"]),
            Err(ArgError::ListenPath(MAX_LISTEN_PATH + 1))
        );
    }

    #[test]
    fn upstream_forms() {
        for good in [
            "127.0.0.1:8080",
            "[::1]:8080",
            "straylight:11434",
            "a-b.c_d:65535",
            "h:1",
        ] {
            assert!(is_host_port(good), "{good}");
        }
        for bad in [
            "",
            ":80",
            "h:",
            "h:0",
            "h:65536",
            "h:+80",
            "h:-1",
            "::1:80",
            "[::1]",
            "[x]:80",
            "h :80",
            "h/x:80",
            "127.0.0.1",
        ] {
            assert!(!is_host_port(bad), "{bad}");
        }
    }
}
