//! `loopd submit|result|cancel|status` and `loopd run --daemon`: clients of `loopd serve`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use loopd::daemon::client;
use loopd::daemon::protocol::{
    CancelCmd, CancelReply, Command, MetricsCmd, MetricsReply, ResultCmd, ResultReply, StatusCmd,
    StatusReply, SubmitCmd, SubmitReply, WaitCmd, WireEvent, WireMessage, WireResult,
};
use loopd::Config;
use serde::de::DeserializeOwned;

use crate::cli::{DaemonAddr, IdArgs, ResultArgs, RunArgs, StatusArgs, SubmitArgs};
use crate::request_watcher::RequestWatcher;

/// How long one reply line may take (a `wait` adds its own timeout).
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

fn socket_of(config: Option<&PathBuf>, socket: Option<&PathBuf>) -> Result<PathBuf, String> {
    if let Some(s) = socket {
        return Ok(s.clone());
    }
    let path = config.ok_or("--config or --socket is required")?;
    let cfg = Config::load(path).map_err(|e| format!("bad config: {e}"))?;
    cfg.daemon
        .socket
        .ok_or_else(|| format!("{}: no [daemon] socket", path.display()))
}

fn addr(a: &DaemonAddr) -> Result<PathBuf, String> {
    socket_of(a.config.as_ref(), a.socket.as_ref())
}

/// Says why `verb` failed (a refusal as `CODE: detail`) and exits 1.
fn fail(verb: &str, e: impl std::fmt::Display) -> ExitCode {
    eprintln!("loopd {verb}: {e}");
    ExitCode::FAILURE
}

fn call<R: DeserializeOwned>(
    verb: &str,
    socket: &std::path::Path,
    cmd: impl Into<Command>,
    timeout: Duration,
) -> Result<R, ExitCode> {
    client::call(socket, &cmd.into(), timeout).map_err(|e| fail(verb, e))
}

fn exit_of(r: &WireResult) -> ExitCode {
    if r.completed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn submit_cmd(
    prompt: &str,
    budget: Option<u32>,
    thinking: bool,
    max_tokens: Option<u64>,
    follow: bool,
) -> SubmitCmd {
    SubmitCmd {
        budget,
        thinking,
        max_tokens,
        follow,
        ..SubmitCmd::new(vec![WireMessage::user(prompt)])
    }
}

fn follow(verb: &str, socket: &std::path::Path, cmd: SubmitCmd) -> ExitCode {
    let mut on_reply = |v: &SubmitReply| eprintln!("loopd {verb}: submitted as req-{}", v.id);
    let mut watcher = RequestWatcher::for_stdout();
    match client::follow(
        socket,
        &cmd.into(),
        Duration::from_secs(3_600),
        &mut on_reply,
        &mut |e: &WireEvent| watcher.event(e),
    ) {
        Ok(ResultReply { result, .. }) => {
            watcher.finish(&result);
            // Followed to the end: fetch it so the daemon need not keep it.
            let _ = client::call::<ResultReply>(
                socket,
                &ResultCmd { id: result.id }.into(),
                REPLY_TIMEOUT,
            );
            exit_of(&result)
        }
        Err(e) => fail(verb, e),
    }
}

/// `loopd submit`.
pub fn submit(a: SubmitArgs) -> ExitCode {
    let socket = match addr(&a.addr) {
        Ok(s) => s,
        Err(e) => return fail("submit", e),
    };
    let mut cmd = submit_cmd(&a.prompt, a.budget, a.thinking, a.max_tokens, a.follow);
    cmd.system = a.system.clone();
    cmd.tools = (!a.tools.is_empty()).then(|| a.tools.clone());
    if let Some(path) = &a.history {
        let earlier = match std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Vec<WireMessage>>(&b).map_err(|e| e.to_string()))
        {
            Ok(m) => m,
            Err(e) => {
                return fail(
                    "submit",
                    format!("--history {}: {e} (want a JSON array)", path.display()),
                )
            }
        };
        let prompt = std::mem::replace(&mut cmd.messages, earlier);
        cmd.messages.extend(prompt);
    }
    if a.follow {
        return follow("submit", &socket, cmd);
    }
    match call::<SubmitReply>("submit", &socket, cmd, REPLY_TIMEOUT) {
        Ok(v) => {
            println!("req-{}", v.id);
            ExitCode::SUCCESS
        }
        Err(c) => c,
    }
}

/// `loopd run --daemon`.
pub fn run(a: RunArgs) -> ExitCode {
    let socket = match socket_of(Some(&a.config), None) {
        Ok(s) => s,
        Err(e) => return fail("run", e),
    };
    follow(
        "run",
        &socket,
        submit_cmd(&a.prompt, a.budget, a.thinking, a.max_tokens, true),
    )
}

/// `loopd result`.
pub fn result(a: ResultArgs) -> ExitCode {
    let socket = match addr(&a.addr) {
        Ok(s) => s,
        Err(e) => return fail("result", e),
    };
    let cmd: Command = if a.wait > 0 {
        WaitCmd {
            id: a.id,
            timeout_ms: Some(a.wait.saturating_mul(1000)),
        }
        .into()
    } else {
        ResultCmd { id: a.id }.into()
    };
    let timeout = REPLY_TIMEOUT + Duration::from_secs(a.wait);
    match call::<ResultReply>("result", &socket, cmd, timeout) {
        Ok(v) if a.json => {
            println!("{}", loopd::daemon::protocol::to_line(&v));
            exit_of(&v.result)
        }
        Ok(v) => {
            RequestWatcher::for_stdout().result(&v.result);
            exit_of(&v.result)
        }
        Err(c) => c,
    }
}

/// `loopd cancel`.
pub fn cancel(a: IdArgs) -> ExitCode {
    let socket = match addr(&a.addr) {
        Ok(s) => s,
        Err(e) => return fail("cancel", e),
    };
    match call::<CancelReply>("cancel", &socket, CancelCmd { id: a.id }, REPLY_TIMEOUT) {
        Ok(v) => {
            println!("req-{}: {}", a.id, v.state.as_str());
            ExitCode::SUCCESS
        }
        Err(c) => c,
    }
}

/// `loopd status`.
pub fn status(a: StatusArgs) -> ExitCode {
    let socket = match addr(&a.addr) {
        Ok(s) => s,
        Err(e) => return fail("status", e),
    };
    if a.metrics {
        return match call::<MetricsReply>("status", &socket, MetricsCmd {}, REPLY_TIMEOUT) {
            Ok(v) => {
                print!("{}", v.metrics);
                ExitCode::SUCCESS
            }
            Err(c) => c,
        };
    }
    match call::<StatusReply>("status", &socket, StatusCmd {}, REPLY_TIMEOUT) {
        Ok(v) => {
            println!("{}", loopd::daemon::protocol::to_line(&v.status));
            ExitCode::SUCCESS
        }
        Err(c) => c,
    }
}
