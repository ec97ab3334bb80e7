//! `inferproxy --listen <socket path> --upstream <host:port> [--socket-mode 0600|0660]`; see
//! `--help`.

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::thread;

use inferproxy::args::{self, Command, Config};
use inferproxy::{listen, serve};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::Signals;

/// Exit status for a command line that was not understood.
const EXIT_USAGE: u8 = 2;
/// Exit status for a start that failed (socket in use, not a socket, bind failed).
const EXIT_START: u8 = 1;

fn main() -> ExitCode {
    match args::parse(std::env::args_os().skip(1)) {
        Ok(Command::Run(config)) => run(&config),
        Ok(Command::Help) => {
            print!("{}", args::help());
            ExitCode::SUCCESS
        }
        Ok(Command::Version) => {
            println!("inferproxy {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("inferproxy: {e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn run(config: &Config) -> ExitCode {
    // Before the socket exists, so a signal at any later point still removes it.
    let mut signals = match Signals::new([SIGTERM, SIGINT, SIGHUP, SIGQUIT]) {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("inferproxy: cannot install signal handlers: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    let path = config.listen.display();
    let bound = match listen::bind_with_mode(&config.listen, config.socket_mode) {
        Ok(bound) => bound,
        Err(e) => {
            eprintln!("inferproxy: {path}: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    let listener = match bound.listener.try_clone() {
        Ok(listener) => listener,
        Err(e) => {
            bound.remove_file();
            eprintln!("inferproxy: {path}: cannot share the listener: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    let upstream = config.upstream.clone();
    let accepting = thread::Builder::new()
        .name("accept".into())
        .spawn(move || serve::accept_loop(&listener, &upstream));
    if let Err(e) = accepting {
        bound.remove_file();
        eprintln!("inferproxy: cannot start the accept thread: {e}");
        return ExitCode::from(EXIT_START);
    }
    eprintln!(
        "inferproxy {}: listening on {path} (mode {}), forwarding to {}",
        env!("CARGO_PKG_VERSION"),
        config.socket_mode,
        config.upstream
    );
    // Blocks until SIGTERM, SIGINT, SIGHUP or SIGQUIT (the same four that stop llama-worker).
    // The path goes first so no new client finds it; returning
    // from main then exits the process, which closes the listener and every connection at once.
    let _ = signals.forever().next();
    bound.remove_file();
    ExitCode::SUCCESS
}
