//! `llama-worker`: runs one llama-server under the restart policy, or talks to a running one.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Parser, Subcommand};
use llama_worker::client::query;
use llama_worker::listen;
use llama_worker::rpc;
use llama_worker::serve::spawn_status_server;
use llama_worker::{Config, State, SystemClock, Worker, WorkerHandle};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::Signals;
use worker_proto::Command as WireCommand;

/// The signals that stop the daemon cleanly (the first) or at once (any later one).
const STOP_SIGNALS: [i32; 4] = [SIGTERM, SIGINT, SIGHUP, SIGQUIT];

fn signal_name(sig: i32) -> &'static str {
    match sig {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        SIGHUP => "SIGHUP",
        SIGQUIT => "SIGQUIT",
        _ => "signal",
    }
}

/// Receives the stop signals on a thread of its own (signal-hook's self-pipe, no code of ours in
/// signal context): the first stops the worker and sets `stopping`, any later one makes the
/// kill skip the grace period.
fn watch_signals(
    mut signals: Signals,
    handle: WorkerHandle<SystemClock>,
    stopping: Arc<AtomicBool>,
) -> Result<(), String> {
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let name = signal_name(sig);
                if stopping.swap(true, Ordering::SeqCst) {
                    eprintln!("llama-worker: {name} again: killing the server's group now");
                    handle.kill_now();
                } else {
                    eprintln!(
                        "llama-worker: {name}: stopping the server (another signal kills it at once)"
                    );
                    handle.stop();
                }
            }
        })
        .map(drop)
        .map_err(|e| format!("cannot start the signal thread: {e}"))
}

/// The command line (clap, derive); every subcommand has its own `--help`.
#[derive(Parser, Debug)]
#[command(
    name = "llama-worker",
    version,
    about = "Keeps one local llama-server alive (restart policy, CPU-time liveness probe, \
             crash-loop protection), or talks to a running llama-worker over its status socket.",
    subcommand_required = true,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the server from the config until a stop signal
    ///
    /// Runs the server from FILE ({port} in its args/env becomes PORT) until SIGTERM, SIGINT,
    /// SIGHUP or SIGQUIT, then stops its process group (SIGTERM, stop_grace_s, SIGKILL) and
    /// exits 0; a second such signal sends SIGKILL at once. Serves status on PATH (or the
    /// config's status_socket), mode 0600 (or --socket-mode 0660); refused if a live process
    /// listens there.
    #[command(verbatim_doc_comment)]
    Run(RunArgs),
    /// Print the state as JSON (one line)
    Status(SocketArgs),
    /// Start again (after failed or stop; clears the restart window)
    Start(SocketArgs),
    /// Stop the server (the daemon keeps serving status)
    Stop(SocketArgs),
    /// Report a stall: the worker restarts the server if it saw no progress either
    Stall(SocketArgs),
    /// Print the counters in the Prometheus text format (ending with "# EOF")
    Metrics(SocketArgs),
    /// Validate the config, run `command --version`, print the command line it would run
    ///
    /// Validates FILE, checks that its command is an executable file that runs (`command
    /// --version` within 10 s: a missing shared library is named) and that log_file's folder
    /// exists, and prints the command line it would run. Refuses what `run --port PORT` would
    /// refuse before starting anything, with the same message; a log_file folder that does
    /// not exist yet but whose parent does (systemd's LogsDirectory= makes it at start) is a
    /// note on stderr, not an error.
    #[command(verbatim_doc_comment)]
    CheckConfig(CheckArgs),
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The worker's config (TOML)
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The server's port ({port} in the config's args and env)
    #[arg(long, value_name = "PORT", value_parser = port)]
    port: Option<u16>,
    /// The status socket to create (default: the config's status_socket)
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The status socket's mode: 0600 (only this user) or 0660 (this user's primary group too)
    #[arg(long, value_name = "MODE", default_value = "0600", value_parser = socket_mode)]
    socket_mode: listen::Mode,
    /// Exit with status 3 when crash-loop protection trips
    #[arg(long)]
    exit_on_failed: bool,
}

fn socket_mode(s: &str) -> Result<listen::Mode, String> {
    s.parse().map_err(|_| "not 0600 or 0660".to_string())
}

#[derive(clap::Args, Debug)]
struct SocketArgs {
    /// The daemon's status socket
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Read the socket's path from this config's status_socket (when no --socket)
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct CheckArgs {
    /// The worker's config (TOML)
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The port to put in the printed command line (default 0)
    #[arg(long, value_name = "PORT", value_parser = port)]
    port: Option<u16>,
}

fn port(v: &str) -> Result<u16, String> {
    v.parse().map_err(|_| "not a port".to_string())
}

/// What every subcommand may have been given, for the helpers below.
#[derive(Default)]
struct Args {
    config: Option<PathBuf>,
    port: Option<u16>,
    socket: Option<PathBuf>,
    socket_mode: listen::Mode,
    exit_on_failed: bool,
}

/// A clap usage error in one line of our words: the flag or command, and what was wrong.
fn usage_error(e: &clap::Error) -> String {
    let context = |k| match e.get(k) {
        Some(ContextValue::String(v)) => v.clone(),
        _ => String::new(),
    };
    // clap names a flag with its value, `--port <PORT>`.
    let arg = context(ContextKind::InvalidArg);
    let flag = arg.split(' ').next().unwrap_or_default();
    let value = context(ContextKind::InvalidValue);
    match e.kind() {
        ErrorKind::UnknownArgument => format!("unknown argument `{arg}` (see --help)"),
        ErrorKind::InvalidSubcommand => format!(
            "unknown command `{}` (see --help)",
            context(ContextKind::InvalidSubcommand)
        ),
        ErrorKind::InvalidValue if value.is_empty() => format!("{flag} needs a value"),
        ErrorKind::ValueValidation => match std::error::Error::source(e) {
            Some(why) => format!("{flag} {value}: {why}"),
            None => format!("{flag} {value}: invalid"),
        },
        ErrorKind::ArgumentConflict if !flag.is_empty() => {
            format!("{flag} given more than once")
        }
        _ => {
            let text = e.render().to_string();
            let line = text.lines().next().unwrap_or_default();
            format!("{} (see --help)", line.trim_start_matches("error: "))
        }
    }
}

fn load(a: &Args) -> Result<Config, String> {
    let path = a.config.as_ref().ok_or("--config FILE is required")?;
    Config::from_file(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// [`load`], checked as `run` on `port` needs it: everything [`Config::validate_for_port`]
/// refuses, and the files the config names must be there (`command`, `log_file`'s folder).
/// `run` and `check-config` both go through here, so one refuses what the other does.
fn load_to_run(a: &Args, port: u16) -> Result<Config, String> {
    let cfg = load(a)?;
    cfg.validate_for_port(port)
        .and_then(|()| cfg.check_files())
        .map_err(|e| {
            let path = a.config.as_deref().unwrap_or(std::path::Path::new(""));
            format!("{}: {e}", path.display())
        })?;
    Ok(cfg)
}

/// How long `check-config` waits for `command --version`.
const VERSION_TIMEOUT: Duration = Duration::from_secs(10);

/// [`load_to_run`] for `check-config`, before the first start: a missing `log_file` folder
/// that systemd's `LogsDirectory=` makes at start is a note on stderr, and the command must
/// run (`--version`).
fn load_to_check(a: &Args, port: u16) -> Result<Config, String> {
    let cfg = load(a)?;
    let path = a.config.as_deref().unwrap_or(std::path::Path::new(""));
    let named = |e: llama_worker::ConfigError| format!("{}: {e}", path.display());
    cfg.validate_for_port(port).map_err(named)?;
    match cfg.check_files() {
        Err(e) if cfg.log_folder_made_at_start(&e) => eprintln!(
            "llama-worker: note: {}: {e} (yet: a unit's LogsDirectory= makes it at start; \
             make it first for `run` outside systemd)",
            path.display()
        ),
        r => r.map_err(named)?,
    }
    cfg.check_runs(VERSION_TIMEOUT).map_err(named)?;
    Ok(cfg)
}

fn socket_path(a: &Args) -> Result<PathBuf, String> {
    if let Some(s) = &a.socket {
        return Ok(s.clone());
    }
    load(a)?
        .status_socket
        .ok_or_else(|| "no --socket and no status_socket in the config".into())
}

fn run(a: &Args) -> Result<ExitCode, String> {
    let port = a.port.ok_or("--port PORT is required")?;
    let cfg = load_to_run(a, port)?;
    let socket = a.socket.clone().or_else(|| cfg.status_socket.clone());
    // Before anything is bound or spawned, so a signal at any later point still cleans up.
    let signals =
        Signals::new(STOP_SIGNALS).map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let signals_handle = signals.handle();
    let mut worker = Worker::new(cfg, port, SystemClock::new()).map_err(|e| e.to_string())?;
    let handle = worker.handle();
    let bound = match &socket {
        Some(path) => {
            let b = listen::bind_with_mode(path, a.socket_mode)
                .map_err(|e| format!("status socket {}: {e}", path.display()))?;
            let l = b
                .listener
                .try_clone()
                .map_err(|e| format!("status socket {}: {e}", path.display()))?;
            spawn_status_server(l, handle.clone());
            Some(b)
        }
        None => None,
    };
    let stopping = Arc::new(AtomicBool::new(false));
    if let Err(e) = watch_signals(signals, handle.clone(), stopping.clone()) {
        if let Some(b) = &bound {
            b.remove_file();
        }
        return Err(e);
    }
    handle.start();
    let mut code = ExitCode::SUCCESS;
    worker.run_until(|state| {
        if stopping.load(Ordering::SeqCst) {
            return true;
        }
        if a.exit_on_failed && state == State::Failed {
            code = ExitCode::from(3);
            return true;
        }
        false
    });
    worker.shutdown();
    signals_handle.close();
    if let Some(b) = &bound {
        b.remove_file();
    }
    eprintln!("llama-worker: stopped");
    Ok(code)
}

fn main_inner() -> Result<ExitCode, String> {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => match e.kind() {
            ErrorKind::DisplayHelp => {
                print!("{}", e.render());
                return Ok(ExitCode::SUCCESS);
            }
            ErrorKind::DisplayVersion => {
                println!("llama-worker {}", env!("CARGO_PKG_VERSION"));
                return Ok(ExitCode::SUCCESS);
            }
            // No command at all: the help, on stderr, and a usage error's status.
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
                eprint!("{}", e.render());
                return Ok(ExitCode::from(2));
            }
            _ => return Err(usage_error(&e)),
        },
    };
    let socket_args = |cmd: WireCommand, s: SocketArgs| {
        let a = Args {
            config: s.config,
            socket: s.socket,
            ..Args::default()
        };
        (cmd, a)
    };
    let (cmd, a) = match cli.command {
        Cmd::Run(r) => {
            return run(&Args {
                config: r.config,
                port: r.port,
                socket: r.socket,
                socket_mode: r.socket_mode,
                exit_on_failed: r.exit_on_failed,
            })
        }
        Cmd::CheckConfig(c) => {
            let a = Args {
                config: c.config,
                port: c.port,
                ..Args::default()
            };
            let port = a.port.unwrap_or(0);
            let cfg = load_to_check(&a, port)?;
            let mut spec = cfg.command_spec(port);
            if let Some(rpc) = &cfg.rpc {
                // The local RPC servers first, as the worker starts them; a port chosen at each
                // start is shown as its placeholder.
                let mut endpoints = Vec::new();
                for l in &rpc.local {
                    let port = l
                        .port
                        .map_or(rpc::RPC_PORT_PLACEHOLDER.to_string(), |p| p.to_string());
                    let args: Vec<String> = l
                        .args
                        .iter()
                        .map(|x| x.replace(rpc::RPC_PORT_PLACEHOLDER, &port))
                        .collect();
                    println!("rpc: {} {}", l.command, args.join(" "));
                    endpoints.push(format!("127.0.0.1:{port}"));
                }
                endpoints.extend(rpc.remote.iter().cloned());
                spec.args.extend([
                    "--rpc".into(),
                    endpoints.join(","),
                    "--cache-ram".into(),
                    "0".into(),
                ]);
            }
            for (k, v) in &spec.env {
                print!("{k}={v} ");
            }
            println!("{} {}", spec.program, spec.args.join(" "));
            return Ok(ExitCode::SUCCESS);
        }
        Cmd::Status(s) => socket_args(WireCommand::Status, s),
        Cmd::Start(s) => socket_args(WireCommand::Start, s),
        Cmd::Stop(s) => socket_args(WireCommand::Stop, s),
        Cmd::Stall(s) => socket_args(WireCommand::Stall, s),
        Cmd::Metrics(s) => {
            let (_, a) = socket_args(WireCommand::Metrics, s);
            let path = socket_path(&a)?;
            let text = worker_proto::metrics(&path, llama_worker::client::ANSWER_TIMEOUT)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            print!("{text}");
            return Ok(ExitCode::SUCCESS);
        }
    };
    let path = socket_path(&a)?;
    let reply = query(&path, cmd.as_str()).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("{reply}");
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    match main_inner() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("llama-worker: {e}");
            ExitCode::from(2)
        }
    }
}
