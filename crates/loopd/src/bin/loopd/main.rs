//! The `loopd` command: the startup self-test, a way to watch one request, one agent request
//! through the request runner, the daemon `loopd serve` and its clients.

mod ask;
mod cli;
mod remote;
mod request_watcher;
mod serve;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use loopd::daemon::protocol::{WireEvent, WireResult};
use loopd::http::SendError;
use loopd::llama::{Cancel, ChatMessage, ChatOptions, ChatRequest, Client};
use loopd::runner::{builtin_tools, Outcome, ResultError, Runner, StandardBios, Submission};
use loopd::selftest;
use loopd::Config;

use cli::{AskArgs, Cli, Cmd, RunArgs};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // Help and version go to stdout with status 0; usage errors to stderr with 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match cli.command {
        Cmd::Selftest { config, slot } => run_selftest(&config, slot),
        Cmd::Ask(a) => run_ask(a),
        Cmd::Run(a) if a.daemon => remote::run(a),
        Cmd::Run(a) => run_agent(a),
        Cmd::Serve { config, folder } => serve::serve(&config, folder.as_deref()),
        Cmd::Submit(a) => remote::submit(a),
        Cmd::Result(a) => remote::result(a),
        Cmd::Cancel(a) => remote::cancel(a),
        Cmd::Status(a) => remote::status(a),
    }
}

/// Loads the config and checks that its socket answers, or says in one line why not.
pub(crate) fn client_for(path: &std::path::Path) -> Result<Client, String> {
    let config = Config::load(path).map_err(|e| format!("bad config: {e}"))?;
    let timeout = Duration::from_millis(config.limits.connect_ms);
    let reached = loopd::http::connect_within(&config.socket, timeout, &Cancel::new());
    if let Err(e) = reached {
        let why = match e {
            SendError::Io(e) => e.to_string(),
            SendError::TimedOut => "no answer within limits.connect_ms".into(),
            SendError::Cancelled => "cancelled".into(),
        };
        return Err(format!(
            "cannot reach the inference socket {}: {why} (is inferproxy running?)",
            config.socket.display()
        ));
    }
    Ok(Client::new(config))
}

/// Waits for `/props` while the server loads the model, up to the config's load wait. Stops
/// at once, with the worker's reason, when llama-worker (`runner.worker_socket`) says it is
/// `failed` or `stopped`: waiting longer would not help.
/// With a worker socket, whether llama-worker would admit a request now: its refusal as
/// `CODE: why` (`WORKER_NOT_READY` for a socket that does not answer, as `submit`).
fn worker_admits(cfg: &loopd::Config) -> Result<(), String> {
    let Some(socket) = cfg.runner.worker_socket.as_deref() else {
        return Ok(());
    };
    let timeout = Duration::from_millis(cfg.runner.worker_timeout_ms);
    match loopd::runner::worker::status(socket, timeout) {
        Ok(st) => match loopd::runner::SubmitError::of_worker_state(st.state) {
            None => Ok(()),
            Some(refused) => Err(format!(
                "{refused}: llama-worker is {}{} (`llama-worker status --socket {}`)",
                st.state.as_str(),
                st.reason.map(|r| format!(": {r}")).unwrap_or_default(),
                socket.display()
            )),
        },
        Err(e) => Err(format!(
            "WORKER_NOT_READY: llama-worker did not answer on {}: {e}",
            socket.display()
        )),
    }
}

pub(crate) fn wait_for_server(client: &Client) -> Result<(), String> {
    let cfg = client.config();
    let limits = cfg.limits;
    let clock = client.clock();
    let deadline = clock.now() + Duration::from_millis(limits.load_wait_ms);
    let worker = cfg.runner.worker_socket.as_deref();
    let worker_timeout = Duration::from_millis(cfg.runner.worker_timeout_ms);
    let mut told = false;
    loop {
        if let Some(socket) = worker {
            // An unreachable worker is no verdict: the wait below still bounds everything.
            if let Ok(st) = loopd::runner::worker::status(socket, worker_timeout) {
                use loopd::runner::worker::WorkerState;
                if matches!(st.state, WorkerState::Failed | WorkerState::Stopped) {
                    return Err(format!(
                        "llama-worker is {}: {} (`llama-worker status --socket {}`)",
                        st.state.as_str(),
                        st.reason.as_deref().unwrap_or("it stopped the server"),
                        socket.display()
                    ));
                }
                // Starting or restarting is worth the wait, said once: the load wait bounds it.
                if matches!(st.state, WorkerState::Starting | WorkerState::Restarting) && !told {
                    told = true;
                    eprintln!(
                        "loopd: llama-worker is {} the server; waiting for it up to {} s \
                         (limits.load_wait_ms)",
                        st.state.as_str(),
                        limits.load_wait_ms / 1000
                    );
                }
            }
        }
        match client.props() {
            Ok(_) => return Ok(()),
            Err(e) if clock.now() >= deadline => {
                return Err(format!(
                    "the server did not answer GET /props within {} s: {e}",
                    limits.load_wait_ms / 1000
                ))
            }
            Err(_) => {
                let poll = Duration::from_millis(limits.poll_ms.min(1000));
                Cancel::new().sleep(clock, poll);
            }
        }
    }
}

fn run_selftest(path: &std::path::Path, slot: u32) -> ExitCode {
    let client = match client_for(path).and_then(|c| wait_for_server(&c).map(|()| c)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("loopd selftest: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cfg = client.config();
    println!(
        "loopd selftest: socket {}, model {}, slot {slot}",
        cfg.socket.display(),
        cfg.model
    );
    let checks = selftest::run(&client, slot, &mut |c| println!("{c}"));
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.name)
        .collect();
    if failed.is_empty() {
        println!(
            "selftest passed: {} of {} checks",
            checks.len(),
            checks.len()
        );
        ExitCode::SUCCESS
    } else {
        println!(
            "selftest FAILED: {} ({} of {} checks failed)",
            failed.join(", "),
            failed.len(),
            checks.len()
        );
        ExitCode::FAILURE
    }
}

fn run_ask(a: AskArgs) -> ExitCode {
    let client = match client_for(&a.config).and_then(|c| wait_for_server(&c).map(|()| c)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("loopd ask: {e}");
            return ExitCode::FAILURE;
        }
    };
    let req = ChatRequest::user(a.slot, a.prompt).with_options(ChatOptions {
        thinking: a.thinking,
        ..ChatOptions::default()
    });
    let stdout = std::io::stdout();
    let terminal = stdout.is_terminal();
    let mut watcher = ask::Watcher::new(stdout.lock(), terminal).on_clock(client.shared_clock());
    match client.chat_with_retry(&req, &mut |ev| watcher.event(ev)) {
        Ok(done) => {
            watcher.finish(&done);
            ExitCode::SUCCESS
        }
        Err(e) => {
            drop(watcher);
            println!();
            eprintln!("loopd ask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_agent(a: RunArgs) -> ExitCode {
    let fail = |e: String| {
        eprintln!("loopd run: {e}");
        ExitCode::FAILURE
    };
    let client = match client_for(&a.config) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // As the daemon's submit: llama-worker is asked first, and a worker that cannot serve
    // refuses at once with the seed's name, without waiting on the server.
    if let Err(e) = worker_admits(client.config()).and_then(|()| wait_for_server(&client)) {
        return fail(e);
    }
    let slots = match client.config().runner.slots {
        0 => match client.props() {
            Ok(p) => p.total_slots,
            Err(e) => return fail(format!("GET /props for total_slots: {e}")),
        },
        n => n,
    };
    let tools = match builtin_tools(a.folder.as_deref(), client.shared_clock()) {
        Ok(t) => t,
        Err(e) => return fail(format!("--folder: {e}")),
    };
    let runner = Runner::new(
        std::sync::Arc::new(client),
        tools,
        std::sync::Arc::new(StandardBios),
        slots,
    );
    let req = Submission {
        messages: vec![ChatMessage::User { content: a.prompt }],
        budget: a.budget,
        options: ChatOptions {
            thinking: a.thinking,
            max_tokens: a.max_tokens,
            ..ChatOptions::default()
        },
        ..Submission::default()
    };
    let watcher = std::sync::Arc::new(std::sync::Mutex::new(
        request_watcher::RequestWatcher::for_stdout(),
    ));
    let w = watcher.clone();
    let observer = Box::new(move |e: &loopd::runner::RequestEvent| {
        if let Some(e) = WireEvent::of(e) {
            w.lock().unwrap_or_else(|e| e.into_inner()).event(&e)
        }
    });
    let id = match runner.submit_observed(req, Some(observer)) {
        Ok(id) => id,
        Err(e) => return fail(format!("submit: {e}")),
    };
    // Every wait of the request has its own deadline; this loop only polls for the end.
    let result = loop {
        match runner.wait_result(id, Duration::from_secs(1)) {
            Ok(r) => break r,
            Err(ResultError::Pending) => {}
            Err(e) => return fail(format!("get_result: {e}")),
        }
    };
    let mut w = watcher.lock().unwrap_or_else(|e| e.into_inner());
    w.finish(&WireResult::from(&result));
    match result.outcome {
        Outcome::Completed { .. } => ExitCode::SUCCESS,
        Outcome::Failed { .. } => ExitCode::FAILURE,
    }
}
