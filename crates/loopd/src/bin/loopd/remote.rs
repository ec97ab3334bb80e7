//! `loopd submit|result|cancel|status` and `loopd run --daemon`: clients of `loopd serve`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use loopd::daemon::client;
use loopd::daemon::protocol::{Submit, WireMessage};
use loopd::Config;
use serde_json::{json, Value};

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

fn fail(verb: &str, e: impl std::fmt::Display) -> ExitCode {
    eprintln!("loopd {verb}: {e}");
    ExitCode::FAILURE
}

/// The daemon's error reply as `CODE: detail`, or `None` for an `ok` reply.
fn refusal(v: &Value) -> Option<String> {
    if v.get("ok") == Some(&Value::Bool(true)) {
        return None;
    }
    Some(format!(
        "{}: {}",
        v["error"].as_str().unwrap_or("?"),
        v["detail"].as_str().unwrap_or("")
    ))
}

fn call(
    verb: &str,
    socket: &std::path::Path,
    cmd: Value,
    timeout: Duration,
) -> Result<Value, ExitCode> {
    match client::call(socket, &cmd, timeout) {
        Ok(v) => match refusal(&v) {
            None => Ok(v),
            Some(r) => Err(fail(verb, r)),
        },
        Err(e) => Err(fail(verb, e)),
    }
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
fn print_result(r: &Value, streamed: bool) {
    let _ = write_result(&mut std::io::stdout().lock(), r, streamed);
}

fn write_result(out: &mut impl Write, r: &Value, streamed: bool) -> std::io::Result<()> {
    let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
    if let (false, Some(c)) = (streamed, r["content"].as_str()) {
        writeln!(out, "{c}")?;
    }
    if !streamed {
        for t in r["tool_calls"].as_array().into_iter().flatten() {
            let ok = t["ok"] == json!(true);
            let line = call_line(&s(&t["name"]), &s(&t["arguments"]), ok, &s(&t["result"]));
            writeln!(out, "{line}")?;
        }
    }
    let why = if r["budget_left"] == json!(0) {
        format!("not run: no tool iterations left (budget {})", r["budget"])
    } else {
        "not run".to_owned()
    };
    for t in r["not_run"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "tool {}({}) -> {why}",
            s(&t["name"]),
            s(&t["arguments"])
        )?;
    }
    let end = match r["outcome"].as_str() {
        Some("completed") => format!(
            "completed ({}) after {} tool calls; {} of {} tool iterations left",
            r["finish_reason"].as_str().unwrap_or("?"),
            r["tool_calls"].as_array().map_or(0, Vec::len),
            r["budget_left"],
            r["budget"]
        ),
        _ => format!(
            "failed: {}: {}",
            r["fail_reason"].as_str().unwrap_or("?"),
            r["detail"].as_str().unwrap_or("")
        ),
    };
    writeln!(out, "req-{}: {end}", r["id"])
}

fn exit_of(r: &Value) -> ExitCode {
    if r["outcome"] == json!("completed") {
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
    fn event(&mut self, e: &Value) {
        let mut out = std::io::stdout().lock();
        let _ = self.write_event(&mut out, e).and_then(|()| out.flush());
    }

    fn write_event(&mut self, out: &mut impl Write, e: &Value) -> std::io::Result<()> {
        let s = |k: &str| e[k].as_str().unwrap_or("").to_owned();
        match e["event"].as_str().unwrap_or("") {
            "content" => write!(out, "{}", s("text")),
            "generation" => writeln!(
                out,
                "\n== generation {}: {} tool iterations left",
                e["number"], e["budget_left"]
            ),
            "tool_started" => {
                self.running = Some((s("id"), s("name"), s("arguments")));
                Ok(())
            }
            "tool_finished" => {
                let ok = e["ok"] == json!(true);
                match self.running.take() {
                    Some((id, name, arguments)) if id == s("id") => {
                        writeln!(out, "\n{}", call_line(&name, &arguments, ok, &s("result")))
                    }
                    _ => writeln!(
                        out,
                        "\ntool call {} -> {}{}",
                        s("id"),
                        if ok { "" } else { "error: " },
                        s("result")
                    ),
                }
            }
            "exit" => writeln!(out, "\nexit signal: {}({})", s("name"), s("arguments")),
            "iteration" => writeln!(
                out,
                "iteration {} done: {} tool iterations left",
                e["number"], e["budget_left"]
            ),
            "retrying" => writeln!(
                out,
                "\nretrying: attempt {} in {:.1} s after: {} (its output so far is dropped)",
                e["attempt"],
                e["after_ms"].as_u64().unwrap_or(0) as f64 / 1000.0,
                s("error")
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
) -> Submit {
    Submit {
        budget,
        thinking,
        max_tokens,
        follow,
        ..Submit::new(vec![WireMessage::user(prompt)])
    }
}

fn cmd_of(s: &Submit) -> Value {
    serde_json::to_value(s).unwrap_or_default()
}

fn follow(verb: &str, socket: &std::path::Path, cmd: Value) -> ExitCode {
    let mut on_reply = |v: &Value| eprintln!("loopd {verb}: submitted as req-{}", v["id"]);
    let mut printer = Printer::default();
    match client::follow(
        socket,
        &cmd,
        Duration::from_secs(3_600),
        &mut on_reply,
        &mut |e: &Value| printer.event(e),
    ) {
        Ok(v) => match refusal(&v) {
            Some(r) => fail(verb, r),
            None => {
                println!();
                print_result(&v["result"], true);
                // Followed to the end: fetch it so the daemon need not keep it.
                let id = v["result"]["id"].clone();
                let _ = client::call(socket, &json!({"cmd": "result", "id": id}), REPLY_TIMEOUT);
                exit_of(&v["result"])
            }
        },
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
        return follow("submit", &socket, cmd_of(&cmd));
    }
    match call("submit", &socket, cmd_of(&cmd), REPLY_TIMEOUT) {
        Ok(v) => {
            println!("req-{}", v["id"]);
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
        cmd_of(&submit_cmd(
            &a.prompt,
            a.budget,
            a.thinking,
            a.max_tokens,
            true,
        )),
    )
}

/// `loopd result`.
pub fn result(a: ResultArgs) -> ExitCode {
    let socket = match addr(&a.addr) {
        Ok(s) => s,
        Err(e) => return fail("result", e),
    };
    let cmd = if a.wait > 0 {
        json!({"cmd": "wait", "id": a.id, "timeout_ms": a.wait.saturating_mul(1000)})
    } else {
        json!({"cmd": "result", "id": a.id})
    };
    let timeout = REPLY_TIMEOUT + Duration::from_secs(a.wait);
    match call("result", &socket, cmd, timeout) {
        Ok(v) if a.json => {
            println!("{v}");
            exit_of(&v["result"])
        }
        Ok(v) => {
            print_result(&v["result"], false);
            exit_of(&v["result"])
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
    match call(
        "cancel",
        &socket,
        json!({"cmd": "cancel", "id": a.id}),
        REPLY_TIMEOUT,
    ) {
        Ok(v) => {
            println!("req-{}: {}", a.id, v["state"].as_str().unwrap_or("?"));
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
    let cmd = json!({"cmd": if a.metrics { "metrics" } else { "status" }});
    match call("status", &socket, cmd, REPLY_TIMEOUT) {
        Ok(v) if a.metrics => {
            print!("{}", v["metrics"].as_str().unwrap_or(""));
            ExitCode::SUCCESS
        }
        Ok(v) => {
            println!("{}", v["status"]);
            ExitCode::SUCCESS
        }
        Err(c) => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let result = json!({"id": 7, "outcome": "failed", "fail_reason": "tool_execution_error",
            "detail": "tool iteration budget exhausted", "content": "Done.",
            "tool_calls": [{"iteration": 1, "id": "a", "name": "read_file",
                            "arguments": "{\"path\": \"start.txt\"}", "ok": true,
                            "result": "go on"}],
            "not_run": [{"id": "b", "name": "read_file", "arguments": "{}"}],
            "budget": 1, "budget_left": 0});
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
