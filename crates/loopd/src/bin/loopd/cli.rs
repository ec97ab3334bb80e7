//! The command line of `loopd`, parsed with clap (derive); `loopd <command> --help` prints
//! each command's options.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// loopd: the agent daemon and its commands.
#[derive(Debug, Parser)]
#[command(name = "loopd", version, about, long_about = None, after_help = crate::exit::TABLE)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Cmd,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Run the three startup checks against the server the config names: /props matches the
    /// [expect] section, a tool call parses, and turn 2 of a conversation hits the cache.
    /// Exit status 0 only when all three pass.
    Selftest {
        /// The loopd config.toml (socket, model, limits, [expect]).
        #[arg(long)]
        config: PathBuf,
        /// The server slot to run on (0 is the main slot).
        #[arg(long, default_value_t = 0)]
        slot: u32,
    },
    /// Send one request through the whole client (slot gate, timers, thinking cap, retry) and
    /// show it as it runs: prompt progress, reasoning, answer, tool calls, notices.
    Ask(AskArgs),
    /// Run one agent request with the built-in tools (current_time, arithmetic, read_file
    /// under --folder, the exit tool finish) and show each generation live; with --daemon,
    /// through a running `loopd serve`. Exit status 0 only when the request completed.
    Run(RunArgs),
    /// The agent daemon: waits for the model, runs the self-test and refuses to start unless
    /// it passes, then serves agent requests on [daemon] socket (docs/loopd.md) with one slot
    /// table for every client, until SIGTERM or SIGINT (a second one exits at once).
    Serve {
        /// The loopd config.toml; [daemon] socket is required.
        #[arg(long)]
        config: PathBuf,
        /// The folder read_file may read under (without it there is no read_file).
        #[arg(long)]
        folder: Option<PathBuf>,
    },
    /// Submit an agent request to `loopd serve`; prints its id (with --follow, its events and
    /// result).
    Submit(SubmitArgs),
    /// Fetch (once) the result of a request from `loopd serve`.
    Result(ResultArgs),
    /// Cancel a running request on `loopd serve`.
    Cancel(IdArgs),
    /// Watch a request on `loopd serve` again (after Ctrl-C on `submit --follow` or `run
    /// --daemon`): its events from now on and its result, or the result if it has ended.
    Follow(IdArgs),
    /// A conversation with `loopd serve` on a terminal: each line a turn of one session (kept
    /// by the daemon; --session NAME resumes it), the reply streamed; Ctrl-C cancels a turn,
    /// Ctrl-D leaves, /help lists the commands. From a pipe: one message a line, each answer
    /// on a line of stdout.
    Chat(ChatArgs),
    /// Print `loopd serve`'s status, one line per field (state, slots, running requests, kept
    /// results, connections, tools), or its reply line, or its metrics.
    Status(StatusArgs),
    /// Check a config as the commands would refuse it (every key, a placeholder template hash,
    /// and what `loopd serve` needs: [daemon] socket, [expect]) without a server, and print it
    /// in one line; status 2 names the key.
    CheckConfig {
        /// The loopd config.toml.
        #[arg(long)]
        config: PathBuf,
        /// Then ask the config's server for /props, print its [expect] section, and fail
        /// (status 1) when it differs from the config's.
        #[arg(long)]
        probe: bool,
    },
    /// Ask a server (llama-server, or inferproxy in front of one) for /props and print the
    /// [expect] section that matches it: its template's SHA-256, n_ctx and total_slots.
    Probe {
        /// The server's Unix socket (the config's `socket`).
        #[arg(long)]
        socket: PathBuf,
        /// The model to ask about, for a router serving several (the config's `model`).
        #[arg(long)]
        model: Option<String>,
    },
    /// Print a completion script for a shell: `loopd completions bash > /etc/bash_completion.d/loopd`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

impl Cmd {
    /// The command's name, as its messages start (`loopd <name>: ...`).
    pub fn name(&self) -> &'static str {
        match self {
            Cmd::Selftest { .. } => "selftest",
            Cmd::Ask(_) => "ask",
            Cmd::Run(_) => "run",
            Cmd::Serve { .. } => "serve",
            Cmd::Submit(_) => "submit",
            Cmd::Result(_) => "result",
            Cmd::Cancel(_) => "cancel",
            Cmd::Follow(_) => "follow",
            Cmd::Status(_) => "status",
            Cmd::Chat(_) => "chat",
            Cmd::CheckConfig { .. } => "check-config",
            Cmd::Probe { .. } => "probe",
            Cmd::Completions { .. } => "completions",
        }
    }
}

/// `loopd ask`.
#[derive(Debug, Args, PartialEq)]
pub struct AskArgs {
    /// The loopd config.toml.
    #[arg(long)]
    pub config: PathBuf,
    /// The server slot to run on.
    #[arg(long, default_value_t = 0)]
    pub slot: u32,
    /// Let the model think before answering.
    #[arg(long)]
    pub thinking: bool,
    /// What to ask.
    pub prompt: String,
}

/// `loopd run`.
#[derive(Debug, Args, PartialEq)]
pub struct RunArgs {
    /// The loopd config.toml (with --daemon: the one whose [daemon] socket to use).
    #[arg(long, required_unless_present = "socket")]
    pub config: Option<PathBuf>,
    /// With --daemon: the daemon's socket, instead of the config's.
    #[arg(long, requires = "daemon")]
    pub socket: Option<PathBuf>,
    /// Tool iterations the request may use (default runner.budget).
    #[arg(long)]
    pub budget: Option<u32>,
    /// Let the model think before answering.
    #[arg(long)]
    pub thinking: bool,
    /// The most tokens each generation may produce (default limits.max_tokens).
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// The folder read_file may read under (in-process only; a daemon has its own).
    #[arg(long, conflicts_with = "daemon")]
    pub folder: Option<PathBuf>,
    /// Submit through the `loopd serve` at --socket (or the config's [daemon] socket)
    /// instead of running a runner in this process.
    #[arg(long)]
    pub daemon: bool,
    /// The user's message.
    pub prompt: String,
}

/// Where the daemon is: its socket, or the config that names it.
#[derive(Debug, Args, PartialEq)]
pub struct DaemonAddr {
    /// The loopd config.toml whose [daemon] socket to use.
    #[arg(long, required_unless_present = "socket")]
    pub config: Option<PathBuf>,
    /// The daemon's socket.
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

/// `loopd chat`.
#[derive(Debug, Args, PartialEq)]
pub struct ChatArgs {
    #[command(flatten)]
    pub addr: DaemonAddr,
    /// The session to resume (opened with this name when there is none); without it, a new
    /// session the daemon names.
    #[arg(long)]
    pub session: Option<String>,
    /// Print the sessions, a line each (name, turns, when its last turn completed in UTC, the
    /// log's bytes, a running turn), most recently used first, and exit.
    #[arg(long, conflicts_with = "session")]
    pub list: bool,
    /// A new session's system message.
    #[arg(long)]
    pub system: Option<String>,
    /// A new session's tool iterations a turn (default runner.budget).
    #[arg(long)]
    pub budget: Option<u32>,
    /// A new session's tools, by name (default: all of the daemon's).
    #[arg(long, value_delimiter = ',')]
    pub tools: Vec<String>,
}

/// `loopd submit`.
#[derive(Debug, Args, PartialEq)]
pub struct SubmitArgs {
    #[command(flatten)]
    pub addr: DaemonAddr,
    /// Tool iterations the request may use (default runner.budget).
    #[arg(long)]
    pub budget: Option<u32>,
    /// Let the model think before answering.
    #[arg(long)]
    pub thinking: bool,
    /// The most tokens each generation may produce (default limits.max_tokens).
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// A system message, sent after the BIOS.
    #[arg(long)]
    pub system: Option<String>,
    /// A tool the request offers the model (repeatable; none given: all of the daemon's); the
    /// daemon refuses names it does not offer.
    #[arg(long = "tool")]
    pub tools: Vec<String>,
    /// Stay connected: print the events and the result as they come.
    #[arg(long)]
    pub follow: bool,
    /// Print the daemon's reply line (`{"ok":true,"id":7}`) instead of `req-7`.
    #[arg(long, conflicts_with = "follow")]
    pub json: bool,
    /// A JSON file of earlier turns, sent before the prompt: an array of messages as the
    /// protocol's `messages` (user, system, assistant with tool_calls, tool).
    #[arg(long, value_name = "FILE")]
    pub history: Option<std::path::PathBuf>,
    /// The user's message.
    pub prompt: String,
}

/// `loopd result`.
#[derive(Debug, Args, PartialEq)]
pub struct ResultArgs {
    #[command(flatten)]
    pub addr: DaemonAddr,
    /// Wait up to this many seconds for the request to end (0: answer at once).
    #[arg(long, default_value_t = 0)]
    pub wait: u64,
    /// Print the result as the daemon's JSON line.
    #[arg(long)]
    pub json: bool,
    /// The request's id (`7` or `req-7`).
    #[arg(value_parser = parse_id)]
    pub id: u64,
}

/// `loopd cancel` and `loopd follow`.
#[derive(Debug, Args, PartialEq)]
pub struct IdArgs {
    #[command(flatten)]
    pub addr: DaemonAddr,
    /// The request's id (`7` or `req-7`).
    #[arg(value_parser = parse_id)]
    pub id: u64,
}

/// `loopd status`.
#[derive(Debug, Args, PartialEq)]
pub struct StatusArgs {
    #[command(flatten)]
    pub addr: DaemonAddr,
    /// Print the metrics (Prometheus text format) instead.
    #[arg(long)]
    pub metrics: bool,
    /// Print the daemon's reply line instead of one line per field.
    #[arg(long, conflicts_with = "metrics")]
    pub json: bool,
}

/// `7` or `req-7`.
fn parse_id(s: &str) -> Result<u64, String> {
    s.strip_prefix("req-")
        .unwrap_or(s)
        .parse()
        .map_err(|_| format!("`{s}` is not a request id (7 or req-7)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cmd, String> {
        let argv = std::iter::once("loopd").chain(args.iter().copied());
        Cli::try_parse_from(argv)
            .map(|c| c.command)
            .map_err(|e| e.kind().to_string())
    }

    #[test]
    fn commands_parse_with_their_options() {
        <Cli as clap::CommandFactory>::command().debug_assert();
        assert!(matches!(
            parse(&["selftest", "--config", "c.toml"]),
            Ok(Cmd::Selftest { slot: 0, .. })
        ));
        let Ok(Cmd::Run(r)) = parse(&[
            "run",
            "--config",
            "c",
            "--budget",
            "3",
            "--thinking",
            "--max-tokens",
            "64",
            "--folder",
            "d",
            "p",
        ]) else {
            panic!()
        };
        assert_eq!(
            (r.budget, r.thinking, r.max_tokens, r.prompt.as_str()),
            (Some(3), true, Some(64), "p")
        );
        let Ok(Cmd::Run(r)) = parse(&["run", "--daemon", "--socket", "s", "p"]) else {
            panic!()
        };
        assert_eq!(
            (r.config, r.socket.as_deref()),
            (None, Some(std::path::Path::new("s")))
        );
        let Ok(Cmd::Result(r)) = parse(&["result", "--socket", "s", "req-7"]) else {
            panic!()
        };
        assert_eq!(r.id, 7);
        let Ok(Cmd::Submit(s)) = parse(&[
            "submit",
            "--config",
            "c",
            "--tool",
            "arithmetic",
            "--tool",
            "finish",
            "--max-tokens",
            "32",
            "hi",
        ]) else {
            panic!()
        };
        assert_eq!(s.tools, ["arithmetic", "finish"]);
        assert_eq!(s.max_tokens, Some(32));
        let Ok(Cmd::Probe { socket, model }) = parse(&["probe", "--socket", "s", "--model", "m"])
        else {
            panic!()
        };
        assert_eq!((socket.to_str(), model.as_deref()), (Some("s"), Some("m")));
        assert!(matches!(
            parse(&["check-config", "--config", "c", "--probe"]),
            Ok(Cmd::CheckConfig { probe: true, .. })
        ));
        assert!(matches!(
            parse(&["completions", "zsh"]),
            Ok(Cmd::Completions {
                shell: clap_complete::Shell::Zsh
            })
        ));
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["selftest"]).is_err());
        assert!(parse(&["run", "--config", "c", "--budget", "-1", "p"]).is_err());
        assert!(parse(&["ask", "--config", "c", "--budget", "1", "p"]).is_err());
        assert!(parse(&["result", "--socket", "s", "x7"]).is_err());
        assert!(parse(&["cancel", "7"]).is_err());
        assert!(parse(&["run", "--config", "c", "--daemon", "--folder", "d", "p"]).is_err());
        // --socket only with --daemon; without --daemon the config is needed.
        assert!(parse(&["run", "--socket", "s", "p"]).is_err());
        assert!(parse(&["submit", "--socket", "s", "--follow", "--json", "p"]).is_err());
        assert!(parse(&["status", "--socket", "s", "--metrics", "--json"]).is_err());
        assert!(parse(&["run", "p"]).is_err());
        assert!(parse(&["run", "--daemon", "p"]).is_err());
        assert!(parse(&["probe"]).is_err());
        assert!(parse(&["check-config"]).is_err());
        assert!(parse(&["completions", "tcsh"]).is_err());
    }
}
