//! The command line: `--listen <socket path> --upstream <host:port>`, `--help`, `--version`.
//!
//! Promise: parsing reads nothing but the arguments it is given; every rejection names the
//! argument that was wrong, in one line.

use core::fmt;
use std::ffi::OsString;
use std::path::PathBuf;

/// Longest `--listen` path in bytes: `sun_path` holds 107 plus a NUL, and the socket is first
/// bound under the same name plus [`crate::listen::STAGING_SUFFIX`] (4 bytes).
pub const MAX_LISTEN_PATH: usize = 103;

/// The usage text printed by `--help`.
pub const USAGE: &str = "\
usage: inferproxy --listen <socket path> --upstream <host:port>

Forwards each connection on a Unix socket to one TCP upstream, byte for byte.
At most 8 connections at a time; accepts limited to a burst of 10, then 2 per second.

  --listen <path>        Unix socket to create (mode 0600); a stale socket there is replaced
  --upstream <host:port> TCP address to forward to, e.g. 127.0.0.1:8080 or [::1]:8080
  --help                 print this and exit
  --version              print the version and exit
";

/// What the process was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Forward connections.
    Run(Config),
    /// Print [`USAGE`] and exit 0.
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
        }
    }
}

impl core::error::Error for ArgError {}

/// Parses the arguments after the program name. `--help` and `--version` win wherever they are.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, ArgError> {
    let mut listen: Option<PathBuf> = None;
    let mut upstream: Option<String> = None;
    let mut args = args.into_iter();
    let mut first_error = None;
    while let Some(arg) = args.next() {
        let step = match arg.to_str() {
            Some("--help" | "-h") => return Ok(Command::Help),
            Some("--version" | "-V") => return Ok(Command::Version),
            Some("--listen") => take(&mut listen, "--listen", args.next().map(PathBuf::from)),
            Some("--upstream") => take(
                &mut upstream,
                "--upstream",
                args.next().map(|v| v.to_string_lossy().into_owned()),
            ),
            _ => Err(ArgError::Unknown(arg.to_string_lossy().into_owned())),
        };
        // Keep scanning so a later --help still works, but report the first mistake.
        if let Err(e) = step {
            first_error.get_or_insert(e);
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let listen = listen.ok_or(ArgError::Missing("--listen"))?;
    let len = listen.as_os_str().len();
    if len == 0 || len > MAX_LISTEN_PATH {
        return Err(ArgError::ListenPath(len));
    }
    let upstream = upstream.ok_or(ArgError::Missing("--upstream"))?;
    if !is_host_port(&upstream) {
        return Err(ArgError::Upstream(upstream));
    }
    Ok(Command::Run(Config { listen, upstream }))
}

fn take<T>(slot: &mut Option<T>, flag: &'static str, value: Option<T>) -> Result<(), ArgError> {
    let value = value.ok_or(ArgError::MissingValue(flag))?;
    if slot.is_some() {
        return Err(ArgError::Repeated(flag));
    }
    *slot = Some(value);
    Ok(())
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
