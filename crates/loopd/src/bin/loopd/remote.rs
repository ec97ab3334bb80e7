//! `loopd submit|result|cancel|status` and `loopd run --daemon`: clients of `loopd serve`.

use std::io::Write;
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

/// One call with its outcome, in the words `loopd run` uses.
fn call_line(name: &str, arguments: &str, ok: bool, result: &str) -> String {
    format!(
        "tool {name}({arguments}) -> {}{result}",
        if ok { "" } else { "error: " }
    )
}

/// Prints a result: the answer and the calls that ran (unless they were streamed already:
/// `streamed`), the calls that never ran and why, then one line of outcome.
fn print_result(r: &WireResult, streamed: bool) {
    let _ = write_result(&mut std::io::stdout().lock(), r, streamed);
}

fn write_result(out: &mut impl Write, r: &WireResult, streamed: bool) -> std::io::Result<()> {
    if let (false, Some(c)) = (streamed, &r.content) {
        writeln!(out, "{c}")?;
    }
    if !streamed {
        for t in &r.tool_calls {
            writeln!(out, "{}", call_line(&t.name, &t.arguments, t.ok, &t.result))?;
        }
    }
    let why = if r.budget_left == 0 {
        format!("not run: no tool iterations left (budget {})", r.budget)
    } else {
        "not run".to_owned()
    };
    for t in &r.not_run {
        writeln!(out, "tool {}({}) -> {why}", t.name, t.arguments)?;
    }
    let end = if r.completed() {
        format!(
            "completed ({}) after {} tool calls; {} of {} tool iterations left",
            r.finish_reason.as_deref().unwrap_or("?"),
            r.tool_calls.len(),
            r.budget_left,
            r.budget
        )
    } else {
        format!(
            "failed: {}: {}",
            r.fail_reason.as_deref().unwrap_or("?"),
            r.detail.as_deref().unwrap_or("")
        )
    };
    writeln!(out, "req-{}: {end}", r.id)
}

fn exit_of(r: &WireResult) -> ExitCode {
    if r.completed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Prints a followed request's events in the words `loopd run` uses: each call once, when it
/// has run, with its outcome.
#[derive(Default)]
struct Printer {
    /// The call running now: its id, name and arguments, from `tool_started`.
    running: Option<(String, String, String)>,
}

impl Printer {
    fn event(&mut self, e: &WireEvent) {
        let mut out = std::io::stdout().lock();
        let _ = self.write_event(&mut out, e).and_then(|()| out.flush());
    }

    fn write_event(&mut self, out: &mut impl Write, e: &WireEvent) -> std::io::Result<()> {
        match e {
            WireEvent::Content { text } => write!(out, "{text}"),
            WireEvent::Generation {
                number,
                budget_left,
            } => writeln!(
                out,
                "\n== generation {number}: {budget_left} tool iterations left"
            ),
            WireEvent::ToolStarted {
                id,
                name,
                arguments,
                ..
            } => {
                self.running = Some((id.clone(), name.clone(), arguments.clone()));
                Ok(())
            }
            WireEvent::ToolFinished { id, ok, result } => match self.running.take() {
                Some((started, name, arguments)) if started == *id => {
                    writeln!(out, "\n{}", call_line(&name, &arguments, *ok, result))
                }
                _ => writeln!(
                    out,
                    "\ntool call {id} -> {}{result}",
                    if *ok { "" } else { "error: " },
                ),
            },
            WireEvent::Exit {
                name, arguments, ..
            } => writeln!(out, "\nexit signal: {name}({arguments})"),
            WireEvent::Iteration {
                number,
                budget_left,
            } => writeln!(
                out,
                "iteration {number} done: {budget_left} tool iterations left"
            ),
            WireEvent::Retrying {
                attempt,
                after_ms,
                error,
            } => writeln!(
                out,
                "\nretrying: attempt {attempt} in {:.1} s after: {error} (its output so far is dropped)",
                *after_ms as f64 / 1000.0,
            ),
            _ => Ok(()),
        }
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
    let mut printer = Printer::default();
    match client::follow(
        socket,
        &cmd.into(),
        Duration::from_secs(3_600),
        &mut on_reply,
        &mut |e: &WireEvent| printer.event(e),
    ) {
        Ok(ResultReply { result, .. }) => {
            println!();
            print_result(&result, true);
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
            print_result(&v.result, false);
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A followed two-iteration request whose third call was refused for the budget: each
    /// call shows once, with its outcome, and the refused one says why.
    #[test]
    fn a_followed_request_shows_each_call_once_with_its_outcome() {
        let events = [
            json!({"event": "generation", "number": 1, "budget_left": 1}),
            json!({"event": "tool_started", "id": "a", "name": "read_file",
                   "arguments": "{\"path\": \"start.txt\"}", "source": "native"}),
            json!({"event": "tool_finished", "id": "a", "ok": true, "result": "go on"}),
            json!({"event": "iteration", "number": 1, "budget_left": 0}),
            json!({"event": "generation", "number": 2, "budget_left": 0}),
            json!({"event": "content", "text": "Do"}),
            json!({"event": "content", "text": "ne."}),
        ];
        let events = events.map(|e| serde_json::from_value::<WireEvent>(e).unwrap());
        let result: WireResult = serde_json::from_value(json!({"id": 7, "outcome": "failed",
            "finish_reason": null, "fail_reason": "tool_execution_error",
            "detail": "tool iteration budget exhausted", "content": "Done.",
            "reasoning_content": null,
            "tool_calls": [{"iteration": 1, "id": "a", "name": "read_file",
                            "arguments": "{\"path\": \"start.txt\"}", "source": "native",
                            "ok": true, "result": "go on"}],
            "not_run": [{"id": "b", "name": "read_file", "arguments": "{}"}], "exits": [],
            "generations": [], "budget": 1, "budget_left": 0, "stalls": [], "retries": []}))
        .unwrap();
        let mut out = Vec::new();
        let mut p = Printer::default();
        for e in &events {
            p.write_event(&mut out, e).unwrap();
        }
        writeln!(out).unwrap();
        write_result(&mut out, &result, true).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\n== generation 1: 1 tool iterations left\n\
             \ntool read_file({\"path\": \"start.txt\"}) -> go on\n\
             iteration 1 done: 0 tool iterations left\n\
             \n== generation 2: 0 tool iterations left\n\
             Done.\n\
             tool read_file({}) -> not run: no tool iterations left (budget 1)\n\
             req-7: failed: tool_execution_error: tool iteration budget exhausted\n"
        );

        // Not followed (`loopd result`): the answer, then every call.
        let mut out = Vec::new();
        write_result(&mut out, &result, false).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "Done.\n\
             tool read_file({\"path\": \"start.txt\"}) -> go on\n\
             tool read_file({}) -> not run: no tool iterations left (budget 1)\n\
             req-7: failed: tool_execution_error: tool iteration budget exhausted\n"
        );
    }
}
