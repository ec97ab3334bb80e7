//! `llama-worker`: runs one llama-server under the restart policy, or talks to a running one.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use llama_worker::client::query;
use llama_worker::listen;
use llama_worker::rpc;
use llama_worker::serve::spawn_status_server;
use llama_worker::{Config, State, SystemClock, Worker, WorkerHandle};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::Signals;

const USAGE: &str = "\
usage:
  llama-worker run --config FILE --port PORT [--socket PATH] [--exit-on-failed]
      run the server from FILE ({port} in its args/env becomes PORT) until SIGTERM, SIGINT,
      SIGHUP or SIGQUIT, then stop its process group (SIGTERM, stop_grace_s, SIGKILL) and
      exit 0; a second such signal sends SIGKILL at once. Serve status on PATH (or the
      config's status_socket), mode 0600; refused if a live process listens there.
      --exit-on-failed: exit with status 3 when crash-loop protection trips.
  llama-worker status|start|stop|stall (--socket PATH | --config FILE)
      status: print the state as JSON; start: start again (after failed or stop);
      stop: stop the server (the daemon keeps serving status); stall: report a stall.
  llama-worker check-config --config FILE [--port PORT]
      validate FILE, check that its command is an executable file and that log_file's
      folder exists, and print the command line it would run.
";

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

#[derive(Default)]
struct Args {
    config: Option<PathBuf>,
    port: Option<u16>,
    socket: Option<PathBuf>,
    exit_on_failed: bool,
}

fn parse_args(rest: &[String]) -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--config" => a.config = Some(value()?.into()),
            "--socket" => a.socket = Some(value()?.into()),
            "--port" => {
                let v = value()?;
                a.port = Some(v.parse().map_err(|_| format!("--port {v}: not a port"))?);
            }
            "--exit-on-failed" => a.exit_on_failed = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn load(a: &Args) -> Result<Config, String> {
    let path = a.config.as_ref().ok_or("--config FILE is required")?;
    Config::from_file(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// [`load`], and the files the config names must be there (`command`, `log_file`'s folder).
fn load_checked(a: &Args) -> Result<Config, String> {
    let cfg = load(a)?;
    cfg.check_files().map_err(|e| {
        let path = a.config.as_deref().unwrap_or(std::path::Path::new(""));
        format!("{}: {e}", path.display())
    })?;
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
    let cfg = load_checked(a)?;
    let port = a.port.ok_or("--port PORT is required")?;
    let socket = a.socket.clone().or_else(|| cfg.status_socket.clone());
    // Before anything is bound or spawned, so a signal at any later point still cleans up.
    let signals =
        Signals::new(STOP_SIGNALS).map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let signals_handle = signals.handle();
    let mut worker = Worker::new(cfg, port, SystemClock::new()).map_err(|e| e.to_string())?;
    let handle = worker.handle();
    let bound = match &socket {
        Some(path) => {
            let b =
                listen::bind(path).map_err(|e| format!("status socket {}: {e}", path.display()))?;
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
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = argv.split_first() else {
        return Err(USAGE.trim_end().into());
    };
    if matches!(cmd.as_str(), "-h" | "--help" | "help") {
        print!("{USAGE}");
        return Ok(ExitCode::SUCCESS);
    }
    let a = parse_args(rest)?;
    match cmd.as_str() {
        "run" => run(&a),
        "status" | "start" | "stop" | "stall" => {
            let path = socket_path(&a)?;
            let reply = query(&path, cmd).map_err(|e| format!("{}: {e}", path.display()))?;
            println!("{reply}");
            Ok(ExitCode::SUCCESS)
        }
        "check-config" => {
            let cfg = load_checked(&a)?;
            let mut spec = cfg.command_spec(a.port.unwrap_or(0));
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
            Ok(ExitCode::SUCCESS)
        }
        other => Err(format!("unknown command {other}\n{USAGE}")),
    }
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
