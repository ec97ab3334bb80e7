//! The `loopd` command: the startup self-test, a way to watch one request, and one agent
//! request through the request runner.

mod ask;
mod run;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use loopd::http::SendError;
use loopd::llama::{Cancel, ChatMessage, ChatOptions, ChatRequest, Client};
use loopd::runner::{builtin_tools, Outcome, ResultError, RunRequest, Runner, StandardBios};
use loopd::selftest;
use loopd::Config;

const USAGE: &str = "\
usage: loopd selftest --config <path> [--slot N]
       loopd ask --config <path> [--thinking] [--slot N] \"<prompt>\"
       loopd run --config <path> [--budget N] [--thinking] [--folder DIR] \"<prompt>\"
       loopd --help | --version

selftest  runs the three startup checks against the server the config names: /props matches
          the [expect] section, a tool call parses, and turn 2 of a conversation hits the cache.
          Exit status 0 only when all three pass.
ask       sends one request through the whole client (slot gate, timers, thinking cap, retry)
          and shows it as it runs: prompt progress, reasoning, answer, tool calls, notices.
run       runs one agent request through the request runner with the built-in tools
          (current_time, arithmetic, read_file under --folder, and the exit tool finish)
          and shows each generation live: the tool iterations left, the calls with their
          arguments, their results, the answer; then tokens and cache use per generation.
          Exit status 0 only when the request completed.

--config  the loopd config.toml (socket, model, limits, [expect])
--slot    the server slot to run on (default 0, the main slot)
--thinking  let the model think before answering (ask and run)
--budget  tool iterations the request may use (run; default runner.budget, 8)
--folder  the folder read_file may read under (run; without it there is no read_file)";

/// What the command line asked for.
#[derive(Debug, PartialEq)]
enum Command {
    Help,
    Version,
    Selftest { config: PathBuf, slot: u32 },
    Ask(AskArgs),
    Run(RunArgs),
}

#[derive(Debug, PartialEq)]
struct RunArgs {
    config: PathBuf,
    budget: Option<u32>,
    thinking: bool,
    folder: Option<PathBuf>,
    prompt: String,
}

#[derive(Debug, PartialEq)]
struct AskArgs {
    config: PathBuf,
    slot: u32,
    thinking: bool,
    prompt: String,
}

fn parse(args: &[String]) -> Result<Command, String> {
    let Some((verb, rest)) = args.split_first() else {
        return Err("missing command (selftest, ask or run)".into());
    };
    let (mut config, mut slot, mut thinking, mut prompt) = (None, 0u32, false, None);
    let (mut budget, mut folder) = (None, None);
    let mut it = rest.iter();
    match verb.as_str() {
        "-h" | "--help" | "help" => return Ok(Command::Help),
        "-V" | "--version" => return Ok(Command::Version),
        "selftest" | "ask" | "run" => {}
        other => return Err(format!("unknown command `{other}`")),
    }
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--config" => {
                let v = it.next().ok_or("--config needs a path")?;
                config = Some(PathBuf::from(v));
            }
            "--slot" if verb == "run" => return Err("unknown option `--slot`".into()),
            "--slot" => {
                let v = it.next().ok_or("--slot needs a number")?;
                slot = v
                    .parse()
                    .map_err(|_| format!("--slot: `{v}` is not a slot number"))?;
            }
            "--budget" if verb == "run" => {
                let v = it.next().ok_or("--budget needs a number")?;
                budget = Some(
                    v.parse()
                        .map_err(|_| format!("--budget: `{v}` is not a number of iterations"))?,
                );
            }
            "--folder" if verb == "run" => {
                let v = it.next().ok_or("--folder needs a path")?;
                folder = Some(PathBuf::from(v));
            }
            "--thinking" if verb == "ask" || verb == "run" => thinking = true,
            "-h" | "--help" => return Ok(Command::Help),
            flag if flag.starts_with("--") => return Err(format!("unknown option `{flag}`")),
            text if verb != "selftest" && prompt.is_none() => prompt = Some(text.to_string()),
            extra => return Err(format!("unexpected argument `{extra}`")),
        }
    }
    let config = config.ok_or("--config <path> is required")?;
    if verb == "selftest" {
        return Ok(Command::Selftest { config, slot });
    }
    let prompt = prompt.ok_or(format!("{verb} needs a prompt"))?;
    if verb == "run" {
        return Ok(Command::Run(RunArgs {
            config,
            budget,
            thinking,
            folder,
            prompt,
        }));
    }
    Ok(Command::Ask(AskArgs {
        config,
        slot,
        thinking,
        prompt,
    }))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse(&args) {
        Ok(Command::Help) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Ok(Command::Version) => {
            println!("loopd {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Ok(Command::Selftest { config, slot }) => run_selftest(&config, slot),
        Ok(Command::Ask(a)) => run_ask(a),
        Ok(Command::Run(a)) => run_agent(a),
        Err(e) => {
            eprintln!(
                "loopd: {e}\n{}",
                USAGE.lines().take(4).collect::<Vec<_>>().join("\n")
            );
            ExitCode::from(2)
        }
    }
}

/// Loads the config and checks that its socket answers, or says in one line why not.
fn client_for(path: &std::path::Path) -> Result<Client, String> {
    let config = Config::load(path).map_err(|e| format!("bad config: {e}"))?;
    let deadline = Instant::now() + Duration::from_millis(config.limits.connect_ms);
    let reached = loopd::http::connect(&config.socket, deadline, &Cancel::new());
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
fn wait_for_server(client: &Client) -> Result<(), String> {
    let cfg = client.config();
    let limits = cfg.limits;
    let deadline = Instant::now() + Duration::from_millis(limits.load_wait_ms);
    let worker = cfg.runner.worker_socket.as_deref();
    let worker_timeout = Duration::from_millis(cfg.runner.worker_timeout_ms);
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
            }
        }
        match client.props() {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "the server did not answer GET /props within {} s: {e}",
                    limits.load_wait_ms / 1000
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(limits.poll_ms.min(1000))),
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
    let mut watcher = ask::Watcher::new(stdout.lock(), terminal);
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
    let client = match client_for(&a.config).and_then(|c| wait_for_server(&c).map(|()| c)) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let slots = match client.config().runner.slots {
        0 => match client.props() {
            Ok(p) => p.total_slots,
            Err(e) => return fail(format!("GET /props for total_slots: {e}")),
        },
        n => n,
    };
    let tools = match builtin_tools(a.folder.as_deref()) {
        Ok(t) => t,
        Err(e) => return fail(format!("--folder: {e}")),
    };
    let runner = Runner::new(
        std::sync::Arc::new(client),
        tools,
        std::sync::Arc::new(StandardBios),
        slots,
    );
    let req = RunRequest {
        messages: vec![ChatMessage::User { content: a.prompt }],
        budget: a.budget,
        options: ChatOptions {
            thinking: a.thinking,
            ..ChatOptions::default()
        },
        ..RunRequest::default()
    };
    let stdout = std::io::stdout();
    let terminal = stdout.is_terminal();
    let watcher = std::sync::Arc::new(std::sync::Mutex::new(run::RunWatcher::new(
        stdout, terminal,
    )));
    let w = watcher.clone();
    let observer = Box::new(move |e: &loopd::runner::RunEvent| {
        w.lock().unwrap_or_else(|e| e.into_inner()).event(e)
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
    w.finish(&result);
    match result.outcome {
        Outcome::Completed { .. } => ExitCode::SUCCESS,
        Outcome::Failed { .. } => ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn selftest_and_ask_parse_with_their_options() {
        assert_eq!(
            parse(&args(&["selftest", "--config", "c.toml"])),
            Ok(Command::Selftest {
                config: "c.toml".into(),
                slot: 0
            })
        );
        assert_eq!(
            parse(&args(&[
                "ask",
                "--thinking",
                "--config",
                "c",
                "--slot",
                "1",
                "hi there"
            ])),
            Ok(Command::Ask(AskArgs {
                config: "c".into(),
                slot: 1,
                thinking: true,
                prompt: "hi there".into()
            }))
        );
        assert_eq!(
            parse(&args(&[
                "run",
                "--config",
                "c",
                "--budget",
                "3",
                "--thinking",
                "--folder",
                "d",
                "p"
            ])),
            Ok(Command::Run(RunArgs {
                config: "c".into(),
                budget: Some(3),
                thinking: true,
                folder: Some("d".into()),
                prompt: "p".into()
            }))
        );
        assert_eq!(
            parse(&args(&["run", "--config", "c", "--budget", "-1", "p"])),
            Err("--budget: `-1` is not a number of iterations".into())
        );
        assert_eq!(
            parse(&args(&["run", "--config", "c"])),
            Err("run needs a prompt".into())
        );
        assert_eq!(
            parse(&args(&["ask", "--config", "c", "--budget", "1", "p"])),
            Err("unknown option `--budget`".into())
        );
        assert_eq!(parse(&args(&["--version"])), Ok(Command::Version));
        assert_eq!(parse(&args(&["ask", "--help"])), Ok(Command::Help));
    }

    #[test]
    fn bad_arguments_are_named() {
        assert_eq!(
            parse(&[]),
            Err("missing command (selftest, ask or run)".into())
        );
        assert_eq!(
            parse(&args(&["serve"])),
            Err("unknown command `serve`".into())
        );
        assert_eq!(
            parse(&args(&["selftest"])),
            Err("--config <path> is required".into())
        );
        assert_eq!(
            parse(&args(&["selftest", "--config", "c", "--thinking"])),
            Err("unknown option `--thinking`".into())
        );
        assert_eq!(
            parse(&args(&["ask", "--config", "c", "--slot", "x", "p"])),
            Err("--slot: `x` is not a slot number".into())
        );
        assert_eq!(
            parse(&args(&["ask", "--config", "c"])),
            Err("ask needs a prompt".into())
        );
        assert_eq!(
            parse(&args(&["ask", "--config", "c", "a", "b"])),
            Err("unexpected argument `b`".into())
        );
    }
}
