//! The `loopd` command: the startup self-test, a way to watch one request, one agent request
//! through the request runner, the daemon `loopd serve` and its clients.

mod ask;
mod chat;
mod check;
mod cli;
mod exit;
mod remote;
mod request_watcher;
mod serve;
mod stdout;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use loopd::daemon::protocol::{WireEvent, WireResult};
use loopd_agent::runner::{
    builtin_tools, Outcome, ResultError, Runner, RunnerConfig, StandardBios, Submission,
};
use loopd_client::http::SendError;
use loopd_client::llama::{Cancel, ChatMessage, ChatOptions, ChatRequest, Client};
use loopd_client::selftest;

use cli::{AskArgs, Cli, Cmd, RunArgs};
use exit::{Exit, Fail};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // Help and version go to stdout with status 0; usage errors to stderr with 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                Exit::Usage.code()
            } else {
                Exit::Completed.code()
            });
        }
    };
    let verb = cli.command.name();
    let done = match cli.command {
        Cmd::Selftest { config, slot } => run_selftest(&config, slot),
        Cmd::Ask(a) => run_ask(a),
        Cmd::Run(a) if a.daemon => remote::run(a),
        Cmd::Run(a) => run_agent(a),
        Cmd::Serve { config, folder } => serve::serve(&config, folder.as_deref()),
        Cmd::Submit(a) => remote::submit(a),
        Cmd::Result(a) => remote::result(a),
        Cmd::Cancel(a) => remote::cancel(a),
        Cmd::Follow(a) => remote::follow_id(a),
        Cmd::Status(a) => remote::status(a),
        Cmd::Chat(a) => chat::chat(a),
        Cmd::CheckConfig { config, probe } => check::check_config(&config, probe),
        Cmd::Probe { socket, model } => check::probe(&socket, model.as_deref()),
        Cmd::Completions { shell } => completions(shell),
    };
    match done {
        Ok(exit) => exit.into(),
        Err(f) => {
            if !f.why.is_empty() {
                // Not eprintln!: a closed stderr must not panic either.
                let _ = writeln!(std::io::stderr(), "loopd {verb}: {}", f.why);
            }
            f.exit.into()
        }
    }
}

/// `loopd completions SHELL`: the script, generated from the command line's own definition.
fn completions(shell: clap_complete::Shell) -> Result<Exit, Fail> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "loopd", &mut script);
    stdout::print(&String::from_utf8_lossy(&script))?;
    Ok(Exit::Completed)
}

/// Loads the config and checks that its socket answers, or says in one line why not.
pub(crate) fn client_for(path: &std::path::Path) -> Result<(loopd::Config, Client), Fail> {
    let config = check::load(path)?;
    let client = reach(&config)?;
    Ok((config, client))
}

/// A client of the config's server, once its socket answers.
pub(crate) fn reach(config: &loopd::Config) -> Result<Client, Fail> {
    let timeout = Duration::from_millis(config.limits.connect_ms);
    let reached = loopd_client::http::connect_within(&config.socket, timeout, &Cancel::new());
    if let Err(e) = reached {
        let why = match e {
            SendError::Io(e) => e.to_string(),
            SendError::TimedOut => "no answer within limits.connect_ms".into(),
            SendError::Cancelled => "cancelled".into(),
        };
        return Err(Fail::new(
            Exit::Unreachable,
            format!(
                "cannot reach the inference socket {}: {why} (is inferproxy running?)",
                config.socket.display()
            ),
        ));
    }
    Ok(Client::new(config.client()))
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
    match loopd_agent::runner::worker::status(socket, timeout) {
        Ok(st) => match loopd_agent::runner::SubmitError::of_worker_state(st.state) {
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

pub(crate) fn wait_for_server(client: &Client, settings: &RunnerConfig) -> Result<(), String> {
    let limits = client.config().limits;
    let clock = client.clock();
    let deadline = clock.now() + Duration::from_millis(limits.load_wait_ms);
    let worker = settings.worker_socket.as_deref();
    let worker_timeout = Duration::from_millis(settings.worker_timeout_ms);
    let mut told = false;
    loop {
        if let Some(socket) = worker {
            // An unreachable worker is no verdict: the wait below still bounds everything.
            if let Ok(st) = loopd_agent::runner::worker::status(socket, worker_timeout) {
                use loopd_agent::runner::worker::WorkerState;
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

fn run_selftest(path: &std::path::Path, slot: u32) -> Result<Exit, Fail> {
    let (config, client) = client_for(path)?;
    wait_for_server(&client, &config.runner).map_err(|e| Fail::new(Exit::Failed, e))?;
    let cfg = client.config();
    stdout::print(&format!(
        "loopd selftest: socket {}, model {}, slot {slot}\n",
        cfg.socket.display(),
        cfg.model
    ))?;
    let mut written = Ok(());
    let checks = selftest::run(&client, slot, &mut |c| {
        if written.is_ok() {
            written = stdout::print(&format!("{c}\n"));
        }
    });
    written?;
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| !c.passed)
        .map(|c| c.name)
        .collect();
    if failed.is_empty() {
        stdout::print(&format!(
            "selftest passed: {} of {} checks\n",
            checks.len(),
            checks.len()
        ))?;
        Ok(Exit::Completed)
    } else {
        stdout::print(&format!(
            "selftest FAILED: {} ({} of {} checks failed)\n",
            failed.join(", "),
            failed.len(),
            checks.len()
        ))?;
        Ok(Exit::Failed)
    }
}

fn run_ask(a: AskArgs) -> Result<Exit, Fail> {
    let (config, client) = client_for(&a.config)?;
    wait_for_server(&client, &config.runner).map_err(|e| Fail::new(Exit::Failed, e))?;
    let req = ChatRequest::user(a.slot, a.prompt).with_options(ChatOptions {
        thinking: a.thinking,
        ..ChatOptions::default()
    });
    let stdout = std::io::stdout();
    let terminal = stdout.is_terminal();
    let mut watcher = ask::Watcher::new(stdout.lock(), terminal).on_clock(client.shared_clock());
    let done = client.chat_with_retry(&req, &mut |ev| watcher.event(ev));
    let exit = match &done {
        Ok(done) => {
            watcher.finish(done);
            Exit::Completed
        }
        Err(_) => {
            watcher.end_line();
            Exit::Failed
        }
    };
    // What was shown first: a closed stdout ends quietly, whatever the request did.
    if let Some(e) = watcher.write_error() {
        return Err(Fail::from(e));
    }
    match done {
        Ok(_) => Ok(exit),
        Err(e) => Err(Fail::new(exit, e.to_string())),
    }
}

fn run_agent(a: RunArgs) -> Result<Exit, Fail> {
    // clap requires it without --daemon; said rather than assumed.
    let config = a
        .config
        .as_deref()
        .ok_or_else(|| Fail::new(Exit::Usage, "--config is required without --daemon"))?;
    let (config, client) = client_for(config)?;
    // As the daemon's submit: llama-worker is asked first, and a worker that cannot serve
    // refuses at once with the seed's name, without waiting on the server.
    worker_admits(&config).map_err(|e| Fail::new(Exit::Refused, e))?;
    wait_for_server(&client, &config.runner).map_err(|e| Fail::new(Exit::Failed, e))?;
    let slots = match config.runner.slots {
        0 => match client.props() {
            Ok(p) => p.total_slots,
            Err(e) => {
                return Err(Fail::new(
                    Exit::Failed,
                    format!("GET /props for total_slots: {e}"),
                ))
            }
        },
        n => n,
    };
    let tools = builtin_tools(a.folder.as_deref(), client.shared_clock())
        .map_err(|e| Fail::new(Exit::Usage, format!("--folder: {e}")))?;
    let runner = Runner::new(
        std::sync::Arc::new(client),
        config.runner,
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
    let observer = Box::new(move |e: &loopd_agent::runner::RequestEvent| {
        if let Some(e) = WireEvent::of(e) {
            w.lock().unwrap_or_else(|e| e.into_inner()).event(&e)
        }
    });
    let id = runner
        .submit_observed(req, Some(observer))
        .map_err(|e| Fail::new(Exit::Refused, format!("submit: {e}")))?;
    // Every wait of the request has its own deadline; this loop only polls for the end.
    let result = loop {
        match runner.wait_result(id, Duration::from_secs(1)) {
            Ok(r) => break r,
            Err(ResultError::Pending) => {}
            Err(e) => return Err(Fail::new(Exit::Failed, format!("get_result: {e}"))),
        }
    };
    let mut w = watcher.lock().unwrap_or_else(|e| e.into_inner());
    w.finish(&WireResult::from(&result));
    Ok(match result.outcome {
        Outcome::Completed { .. } => Exit::Completed,
        Outcome::Failed { .. } => Exit::Failed,
    })
}
