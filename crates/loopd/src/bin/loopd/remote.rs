//! `loopd submit|result|cancel|follow|status` and `loopd run --daemon`: clients of `loopd
//! serve`.
//! Each ends with a status of the table in [`crate::exit`]: the daemon's error code picks it
//! ([`exit_of_code`]), a socket nothing answers on is [`Exit::Unreachable`], and every line
//! goes through [`crate::stdout`], so a closed stdout ends the command quietly.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loopd::daemon::client::{self, ClientError};
use loopd::daemon::protocol::{
    to_line, CancelCmd, CancelReply, Command, ErrorCode, FollowCmd, MetricsCmd, MetricsReply,
    ResultCmd, ResultReply, ServeState, Status, StatusCmd, StatusReply, SubmitCmd, SubmitReply,
    WaitCmd, WireEvent, WireMessage, WireResult,
};
use loopd::Config;
use serde::de::DeserializeOwned;

use crate::cli::{DaemonAddr, IdArgs, ResultArgs, RunArgs, StatusArgs, SubmitArgs};
use crate::exit::{Exit, Fail};
use crate::request_watcher::RequestWatcher;
use crate::stdout;

/// How long one reply line may take (a `wait` adds its own timeout).
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) fn socket_of(
    config: Option<&PathBuf>,
    socket: Option<&PathBuf>,
) -> Result<PathBuf, Fail> {
    if let Some(s) = socket {
        return Ok(s.clone());
    }
    let path = config.ok_or_else(|| Fail::new(Exit::Usage, "--config or --socket is required"))?;
    let cfg = Config::load(path).map_err(|e| Fail::new(Exit::Usage, format!("bad config: {e}")))?;
    cfg.daemon.socket.ok_or_else(|| {
        Fail::new(
            Exit::Usage,
            format!("{}: no [daemon] socket", path.display()),
        )
    })
}

pub(crate) fn addr(a: &DaemonAddr) -> Result<PathBuf, Fail> {
    socket_of(a.config.as_ref(), a.socket.as_ref())
}

/// The status a daemon's error code ends a client with: the request was not taken (3, a busy
/// or full session too), there is no such request or session (4), it is still running (5), the
/// command line asked for what the daemon refuses (2, a session name taken too), anything else
/// failed (1).
pub fn exit_of_code(c: ErrorCode) -> Exit {
    match c {
        ErrorCode::NotFound | ErrorCode::SessionNotFound => Exit::NotFound,
        ErrorCode::Pending => Exit::Pending,
        ErrorCode::SessionBusy
        | ErrorCode::SessionFull
        | ErrorCode::NoSlotAvailable
        | ErrorCode::WorkerNotReady
        | ErrorCode::WorkerFailed
        | ErrorCode::WorkerStopped
        | ErrorCode::NoThread
        | ErrorCode::ShuttingDown
        | ErrorCode::StoreFull
        | ErrorCode::TooManyConnections => Exit::Refused,
        ErrorCode::UnknownTool | ErrorCode::LineTooLong | ErrorCode::SessionExists => Exit::Usage,
        _ => Exit::Failed,
    }
}

/// A failed call: the daemon's refusal as `CODE: detail` with its status, an unreachable
/// socket (named) as 6, anything else as 1.
pub(crate) fn fail_of(e: ClientError) -> Fail {
    let exit = match &e {
        ClientError::Connect(_) => Exit::Unreachable,
        ClientError::Refused(r) => exit_of_code(r.error),
        _ => Exit::Failed,
    };
    Fail::new(exit, e.to_string())
}

pub(crate) fn call<R: DeserializeOwned>(
    socket: &Path,
    cmd: impl Into<Command>,
    timeout: Duration,
) -> Result<R, Fail> {
    client::call(socket, &cmd.into(), timeout).map_err(fail_of)
}

/// 0 for a completed request, 1 for a failed one.
pub(crate) fn exit_of(r: &WireResult) -> Exit {
    if r.completed() {
        Exit::Completed
    } else {
        Exit::Failed
    }
}

/// What the watcher could not write (a closed stdout: 141), else `exit`.
fn shown<W: std::io::Write>(w: &mut RequestWatcher<W>, exit: Exit) -> Result<Exit, Fail> {
    match w.write_error() {
        Some(e) => Err(Fail::from(e)),
        None => Ok(exit),
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

/// On Ctrl-C while a request is followed: the request goes on in the daemon, so say how to
/// watch it again or stop it (once its id is known), and end with [`Exit::Interrupted`].
fn hint_on_interrupt(verb: &'static str, socket: &Path) -> Arc<Mutex<Option<u64>>> {
    let id = Arc::new(Mutex::new(None::<u64>));
    let Ok(mut signals) = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT]) else {
        // No handler: Ctrl-C ends the command as it always did, without the hint.
        return id;
    };
    let (seen, socket) = (id.clone(), socket.display().to_string());
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            let known = *seen.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = known {
                let _ = std::io::Write::write_all(
                    &mut std::io::stderr(),
                    format!(
                        "loopd {verb}: interrupted; req-{n} goes on in the daemon: \
                         `loopd follow --socket {socket} {n}` shows it again, \
                         `loopd cancel --socket {socket} {n}` stops it\n"
                    )
                    .as_bytes(),
                );
            }
            std::process::exit(Exit::Interrupted.code().into());
        }
    });
    id
}

/// Shows a followed request to its end (the renderer of `loopd run`), fetches its result so
/// the daemon need not keep it, and ends with its status.
fn follow(verb: &'static str, socket: &Path, cmd: Command, announce: bool) -> Result<Exit, Fail> {
    let ended_id = match &cmd {
        Command::Follow(f) => Some(f.id),
        _ => None,
    };
    let id = hint_on_interrupt(verb, socket);
    let mut on_reply = |v: &SubmitReply| {
        *id.lock().unwrap_or_else(|e| e.into_inner()) = Some(v.id);
        if announce {
            eprintln!("loopd {verb}: submitted as req-{}", v.id);
        }
    };
    let mut watcher = RequestWatcher::for_stdout();
    let followed = client::follow(
        socket,
        &cmd,
        Duration::from_secs(3_600),
        &mut on_reply,
        &mut |e: &WireEvent| watcher.event(e),
    );
    let result = match followed {
        Ok(ResultReply { result, .. }) => result,
        // `follow` of a request that has ended: its result is kept, shown as `result` does.
        Err(ClientError::Refused(r)) if r.error == ErrorCode::Ended => match ended_id {
            Some(id) => return show_result(socket, ResultCmd { id }.into(), REPLY_TIMEOUT, false),
            None => return Err(fail_of(ClientError::Refused(r))),
        },
        Err(e) => return Err(fail_of(e)),
    };
    watcher.finish(&result);
    // Followed to the end: fetch it so the daemon need not keep it.
    let _ = client::call::<ResultReply>(socket, &ResultCmd { id: result.id }.into(), REPLY_TIMEOUT);
    shown(&mut watcher, exit_of(&result))
}

/// `loopd submit`.
pub fn submit(a: SubmitArgs) -> Result<Exit, Fail> {
    let socket = addr(&a.addr)?;
    let mut cmd = submit_cmd(&a.prompt, a.budget, a.thinking, a.max_tokens, a.follow);
    cmd.system = a.system.clone();
    cmd.tools = (!a.tools.is_empty()).then(|| a.tools.clone());
    if let Some(path) = &a.history {
        let earlier = std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Vec<WireMessage>>(&b).map_err(|e| e.to_string()))
            .map_err(|e| {
                Fail::new(
                    Exit::Usage,
                    format!("--history {}: {e} (want a JSON array)", path.display()),
                )
            })?;
        let prompt = std::mem::replace(&mut cmd.messages, earlier);
        cmd.messages.extend(prompt);
    }
    if a.follow {
        return follow("submit", &socket, cmd.into(), true);
    }
    let v: SubmitReply = call(&socket, cmd, REPLY_TIMEOUT)?;
    let line = if a.json {
        to_line(&v)
    } else {
        format!("req-{}", v.id)
    };
    stdout::print(&format!("{line}\n"))?;
    Ok(Exit::Completed)
}

/// `loopd run --daemon`.
pub fn run(a: RunArgs) -> Result<Exit, Fail> {
    let socket = socket_of(a.config.as_ref(), a.socket.as_ref())?;
    follow(
        "run",
        &socket,
        submit_cmd(&a.prompt, a.budget, a.thinking, a.max_tokens, true).into(),
        true,
    )
}

/// `loopd result`.
pub fn result(a: ResultArgs) -> Result<Exit, Fail> {
    let socket = addr(&a.addr)?;
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
    show_result(&socket, cmd, timeout, a.json)
}

/// Fetches a result with `cmd` (`result` or `wait`) and shows it: the daemon's line with
/// `json`, else rendered.
fn show_result(socket: &Path, cmd: Command, timeout: Duration, json: bool) -> Result<Exit, Fail> {
    let v: ResultReply = call(socket, cmd, timeout)?;
    if json {
        stdout::print(&format!("{}\n", to_line(&v)))?;
        return Ok(exit_of(&v.result));
    }
    let mut w = RequestWatcher::for_stdout();
    w.result(&v.result);
    shown(&mut w, exit_of(&v.result))
}

/// `loopd follow`: a running request's events from now on and its result; one that has
/// ended already, its result as `loopd result` shows it.
pub fn follow_id(a: IdArgs) -> Result<Exit, Fail> {
    let socket = addr(&a.addr)?;
    follow("follow", &socket, FollowCmd { id: a.id }.into(), false)
}

/// `loopd cancel`.
pub fn cancel(a: IdArgs) -> Result<Exit, Fail> {
    let socket = addr(&a.addr)?;
    let v: CancelReply = call(&socket, CancelCmd { id: a.id }, REPLY_TIMEOUT)?;
    stdout::print(&format!("req-{}: {}\n", a.id, v.state.as_str()))?;
    Ok(Exit::Completed)
}

/// `loopd status`.
pub fn status(a: StatusArgs) -> Result<Exit, Fail> {
    let socket = addr(&a.addr)?;
    if a.metrics {
        let v: MetricsReply = call(&socket, MetricsCmd {}, REPLY_TIMEOUT)?;
        stdout::print(&v.metrics)?;
        return Ok(Exit::Completed);
    }
    let v: StatusReply = call(&socket, StatusCmd {}, REPLY_TIMEOUT)?;
    let text = if a.json {
        format!("{}\n", to_line(&v))
    } else {
        readable(&v.status)
    };
    stdout::print(&text)?;
    Ok(Exit::Completed)
}

/// The daemon's status, one line per field.
fn readable(s: &Status) -> String {
    let state = match s.state {
        ServeState::Serving => "serving",
        ServeState::Stopping => "stopping",
    };
    let list = |items: Vec<String>| {
        if items.is_empty() {
            "none".to_owned()
        } else {
            items.join(", ")
        }
    };
    let mut out = format!(
        "state: {state}\nslots: {} busy of {}\nrunning: {}\nkept results: {}\n\
         connections: {}\ntools: {}\n",
        s.busy,
        s.slots,
        list(s.running.iter().map(|id| format!("req-{id}")).collect()),
        s.kept,
        s.connections,
        list(s.tools.clone()),
    );
    for h in &s.hosts {
        out.push_str(&format!(
            "host {}: {}, {} busy of {}\n",
            h.name, h.state, h.busy, h.slots
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_reads_one_line_per_field() {
        let mut s = Status {
            state: ServeState::Serving,
            slots: 2,
            busy: 1,
            running: vec![3, 4],
            kept: 1,
            connections: 2,
            tools: vec!["arithmetic".into(), "finish".into()],
            hosts: vec![],
        };
        assert_eq!(
            readable(&s),
            "state: serving\nslots: 1 busy of 2\nrunning: req-3, req-4\nkept results: 1\n\
             connections: 2\ntools: arithmetic, finish\n"
        );
        (s.state, s.running, s.tools) = (ServeState::Stopping, vec![], vec![]);
        assert_eq!(
            readable(&s),
            "state: stopping\nslots: 1 busy of 2\nrunning: none\nkept results: 1\n\
             connections: 2\ntools: none\n"
        );
        s.hosts = vec![loopd::daemon::protocol::HostLine {
            name: "gpu-b".into(),
            state: "lost".into(),
            slots: 2,
            busy: 0,
        }];
        assert!(readable(&s).ends_with("tools: none\nhost gpu-b: lost, 0 busy of 2\n"));
    }

    #[test]
    fn every_error_code_has_its_status() {
        let by_code: Vec<(&str, u8)> = ErrorCode::ALL
            .iter()
            .map(|c| (c.as_str(), exit_of_code(*c).code()))
            .collect();
        assert_eq!(
            by_code,
            [
                ("NOT_FOUND", 4),
                ("PENDING", 5),
                ("NO_SLOT_AVAILABLE", 3),
                ("WORKER_NOT_READY", 3),
                ("WORKER_FAILED", 3),
                ("WORKER_STOPPED", 3),
                ("NO_THREAD", 3),
                ("UNKNOWN_TOOL", 2),
                ("SHUTTING_DOWN", 3),
                ("STORE_FULL", 3),
                ("STORE_FAILED", 1),
                ("LINE_TOO_LONG", 2),
                ("READ_TIMEOUT", 1),
                ("BAD_JSON", 1),
                ("UNKNOWN_COMMAND", 1),
                ("BAD_REQUEST", 1),
                ("ENDED", 1),
                ("FOLLOWER_DROPPED", 1),
                ("TOO_MANY_CONNECTIONS", 3),
                ("SESSION_NOT_FOUND", 4),
                ("SESSION_EXISTS", 2),
                ("SESSION_BUSY", 3),
                ("SESSION_FULL", 3),
            ]
        );
    }
}
