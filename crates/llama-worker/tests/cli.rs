//! The `llama-worker` binary: run, the 0600 status socket and its commands, SIGTERM stops the
//! whole group and exits 0.

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::{dead, describe, live, wait_group_gone, wait_members, Endpoint, Mode};

const BIN: &str = env!("CARGO_BIN_EXE_llama-worker");

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lw-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ask(socket: &Path, cmd: &str) -> String {
    let out = Command::new(BIN)
        .args([cmd, "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{cmd}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The number after `"key":` in a status line.
fn field(json: &str, key: &str) -> String {
    let at = json.find(&format!("\"{key}\":")).unwrap() + key.len() + 3;
    json[at..]
        .split([',', '}'])
        .next()
        .unwrap()
        .trim_matches('"')
        .to_string()
}

fn wait_status(socket: &Path, state: &str) -> String {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if socket.exists() {
            let s = ask(socket, "status");
            if field(&s, "state") == state {
                return s;
            }
        }
        assert!(Instant::now() < end, "never reached {state}");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn run_serves_status_on_a_0600_socket_and_sigterm_stops_the_group() {
    let ep = Endpoint::start(Mode::Ok);
    let dir = temp_dir("run");
    let socket = dir.join("worker.sock");
    let log = dir.join("server.log");
    let config = dir.join("worker.toml");
    std::fs::write(
        &config,
        format!(
            r#"
command = "/bin/sh"
args = ["-c", "echo port={{port}}; sleep 300 & sleep 301 & wait"]
log_file = {log:?}
status_socket = {socket:?}
startup_probe_interval_s = 0.05
stop_grace_s = 1
"#
        ),
    )
    .unwrap();
    let check = Command::new(BIN)
        .args(["check-config", "--port", "8099", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(check.stdout).unwrap(),
        "/bin/sh -c echo port=8099; sleep 300 & sleep 301 & wait\n"
    );
    let mut child = KillOnDrop(
        Command::new(BIN)
            .args(["run", "--port", &ep.port.to_string(), "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let status = wait_status(&socket, "ready");
    let meta = std::fs::metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(field(&status, "port"), ep.port.to_string());
    assert_eq!(field(&status, "consecutive_restarts"), "0");
    assert!(
        status.contains("\"last_readiness\":{\"ok\":true,\"path\":\"/v1/models\",\"answer\":200,")
    );
    let pgid: i32 = field(&status, "pgid").parse().unwrap();
    let members = wait_members(pgid, 4); // guard, sh, two sleeps
    assert_eq!(members.len(), 4, "{members:?}");
    assert!(ask(&socket, "stall").starts_with("{\"stall\":\"not_stalled\",\"since_progress_s\":"));
    assert_eq!(
        llama_worker::client::query(&socket, "bogus").unwrap(),
        "{\"error\":\"unknown command; use status, start, stop, stall or metrics\"}"
    );
    let end = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("port=")
    {
        assert!(Instant::now() < end);
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        format!("port={}\n", ep.port)
    );

    let rc = sigterm(child.0.id());
    assert!(rc);
    let end = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < end, "worker did not exit on SIGTERM");
        thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    assert_eq!(live(pgid), Vec::<i32>::new());
    for pid in members {
        assert!(dead(pid));
    }
    assert!(!socket.exists(), "socket left behind");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--socket-mode 0660`: the status socket is group-connectable, so loopd running as another
/// user of the worker's group (the units in docs/) can read the worker's state.
#[test]
fn socket_mode_0660_makes_a_group_socket() {
    let ep = Endpoint::start(Mode::Ok);
    let dir = temp_dir("mode");
    let socket = dir.join("worker.sock");
    let config = dir.join("worker.toml");
    std::fs::write(
        &config,
        format!(
            "command = \"/bin/sh\"\nargs = [\"-c\", \"exec sleep 300\"]\n\
             log_file = {:?}\nstartup_probe_interval_s = 0.05\nstop_grace_s = 1\n",
            dir.join("server.log")
        ),
    )
    .unwrap();
    let mut child = KillOnDrop(
        Command::new(BIN)
            .args([
                "run",
                "--socket-mode",
                "0660",
                "--port",
                &ep.port.to_string(),
            ])
            .arg("--socket")
            .arg(&socket)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_status(&socket, "ready");
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o660);
    assert!(sigterm(child.0.id()));
    let (exit, _) = exit_within(&mut child, Duration::from_secs(10));
    assert!(exit.success(), "{exit:?}");
    assert!(!socket.exists(), "socket left behind");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A failing assertion must not leave the daemon (and its server) running: SIGKILL, after which
/// the worker's guard kills the server's group.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// SIGTERM through the `kill` command.
fn sigterm(pid: u32) -> bool {
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success()
}

#[test]
fn help_of_every_command_names_its_flags() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--help"],
            &[
                "run",
                "status",
                "start",
                "stop",
                "stall",
                "metrics",
                "check-config",
                "--version",
            ],
        ),
        (
            &["run", "--help"],
            &[
                "--config <FILE>",
                "--port <PORT>",
                "--socket <PATH>",
                "--exit-on-failed",
            ],
        ),
        (
            &["status", "--help"],
            &["--socket <PATH>", "--config <FILE>"],
        ),
        (
            &["start", "--help"],
            &["--socket <PATH>", "--config <FILE>"],
        ),
        (&["stop", "--help"], &["--socket <PATH>", "--config <FILE>"]),
        (
            &["stall", "--help"],
            &["--socket <PATH>", "--config <FILE>"],
        ),
        (
            &["check-config", "--help"],
            &["--config <FILE>", "--port <PORT>"],
        ),
    ];
    for (args, names) in cases {
        let out = Command::new(BIN).args(*args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        for name in *names {
            assert!(
                text.contains(name),
                "{args:?} does not name {name}:\n{text}"
            );
        }
    }
}

#[test]
fn usage_errors_exit_2_with_one_line_naming_them() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["dance"],
            "llama-worker: unknown command `dance` (see --help)\n",
        ),
        (
            &["status", "--port", "1"],
            "llama-worker: unknown argument `--port` (see --help)\n",
        ),
        (&["run", "--port"], "llama-worker: --port needs a value\n"),
        (
            &["run", "--socket", "a", "--socket", "b"],
            "llama-worker: --socket given more than once\n",
        ),
        (
            &["run", "--port", "1"],
            "llama-worker: --config FILE is required\n",
        ),
        (
            &["run", "--socket-mode", "0666"],
            "llama-worker: --socket-mode 0666: not 0600 or 0660\n",
        ),
    ];
    for (args, want) in cases {
        let out = Command::new(BIN).args(*args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert_eq!(String::from_utf8(out.stderr).unwrap(), *want, "{args:?}");
    }
    // No command at all: the usage on stderr.
    let out = Command::new(BIN).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("Usage: llama-worker <COMMAND>"));
}

#[test]
fn bad_config_and_bad_usage_exit_2_with_the_reason() {
    let dir = temp_dir("bad");
    let config = dir.join("bad.toml");
    std::fs::write(&config, "command = \"x\"\nstall_timeout = 3\n").unwrap();
    let out = Command::new(BIN)
        .args(["run", "--port", "1", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("unknown field `stall_timeout`"), "{err}");
    let out = Command::new(BIN)
        .args(["run", "--port", "x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "llama-worker: --port x: not a port\n"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// After `kill -KILL` of the worker no process of the server's group is left, whatever
/// the command: PR_SET_PDEATHSIG reaches only the direct child, the guard reaches the group.
#[test]
fn a_sigkilled_worker_leaves_no_process_of_the_group() {
    let ep = Endpoint::start(Mode::Ok);
    let dir = temp_dir("orphans");
    let wrapper = dir.join("wrapper.sh");
    // A wrapper that does not exec: the shell stays the direct child, the server its child.
    std::fs::write(&wrapper, "#!/bin/sh\n/bin/sleep 300\necho server exited\n").unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cases = [
        (format!("command = {wrapper:?}"), "wrapper without exec"),
        (
            // The server (`sleep 300` after the exec) has a child that outlives it.
            "command = \"/bin/sh\"\nargs = [\"-c\", \"sleep 301 & exec sleep 300\"]".to_string(),
            "server with a child",
        ),
    ];
    for (i, (command, what)) in cases.into_iter().enumerate() {
        let socket = dir.join(format!("worker-{i}.sock"));
        let config = dir.join("worker.toml");
        std::fs::write(
            &config,
            format!("{command}\nstatus_socket = {socket:?}\nstartup_probe_interval_s = 0.05\n"),
        )
        .unwrap();
        let mut child = spawn_run(&config, &ep);
        let status = wait_status(&socket, "ready");
        let pgid: i32 = field(&status, "pgid").parse().unwrap();
        let members = wait_members(pgid, 3); // guard, and the two processes of the case
        assert_eq!(members.len(), 3, "{what}: {:?}", describe(pgid));
        child.0.kill().unwrap(); // SIGKILL: the worker cannot clean up
        exit_within(&mut child, Duration::from_secs(5));
        wait_group_gone(pgid, Duration::from_secs(5));
        for pid in members {
            assert!(dead(pid), "{what}: pid {pid}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn exit_on_failed_exits_3_and_socket_commands_stop_and_start() {
    let ep = Endpoint::start(Mode::Unavailable);
    let dir = temp_dir("failed");
    let socket = dir.join("worker.sock");
    let config = dir.join("worker.toml");
    std::fs::write(
        &config,
        format!(
            "command = \"/bin/sh\"\nargs = [\"-c\", \"exit 1\"]\nstatus_socket = {socket:?}\n\
             max_restarts_per_window = 2\nrestart_backoff_s = 0.05\n"
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args([
            "run",
            "--exit-on-failed",
            "--port",
            &ep.port.to_string(),
            "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.matches("spawned /bin/sh").count(), 3, "{err}");
    assert!(err.contains("-> failed exited"), "{err}");

    // Without the flag the daemon stays up in failed; start/stop work over the socket.
    let mut child = KillOnDrop(
        Command::new(BIN)
            .args(["run", "--port", &ep.port.to_string(), "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let s = wait_status(&socket, "failed");
    assert_eq!(field(&s, "consecutive_restarts"), "2");
    assert_eq!(field(&s, "last_cause"), "exited");
    let s = ask(&socket, "stop");
    assert_eq!(field(&s, "state"), "stopped");
    let s = ask(&socket, "start");
    // The driving loop may already have seen the first exit.
    assert!(
        ["starting", "restarting"].contains(&field(&s, "state").as_str()),
        "{s}"
    );
    let s = wait_status(&socket, "failed");
    assert_eq!(
        field(&s, "spawns"),
        "6",
        "a fresh window allows 2 restarts again"
    );
    assert!(sigterm(child.0.id()));
    assert!(exit_within(&mut child, Duration::from_secs(10)).0.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `llama-worker args...` to its exit, at most `limit`; its exit code and stderr. On
/// timeout it is killed and the test fails with what it printed.
fn run_bounded(args: &[&str], limit: Duration) -> (Option<i32>, String) {
    let mut child = KillOnDrop(
        Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut pipe = child.0.stderr.take().unwrap();
    let reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut pipe, &mut s);
        s
    });
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= end {
            child.0.kill().unwrap();
            child.0.wait().unwrap();
            panic!(
                "llama-worker {args:?} still running after {limit:?}; stderr:\n{}",
                reader.join().unwrap()
            );
        }
        thread::sleep(Duration::from_millis(20));
    };
    (status.code(), reader.join().unwrap())
}

/// A server that never gets ready, with the default proportions scaled down 100
/// times (120 s deadline, 2 s backoff, 600 s window, 5 restarts), ends in failed: six spawns.
#[test]
fn a_never_ready_server_with_the_default_proportions_ends_failed() {
    let ep = Endpoint::start(Mode::Unavailable);
    let dir = temp_dir("neverready");
    let config = dir.join("worker.toml");
    std::fs::write(
        &config,
        r#"
command = "/bin/sh"
args = ["-c", "sleep 300"]
startup_deadline_s = 1.2
startup_probe_interval_s = 0.005
probe_interval_s = 0.05
probe_timeout_s = 0.05
unready_restart_s = 0.3
cpu_probe_interval_s = 0.05
stall_timeout_s = 1.2
restart_window_s = 6
max_restarts_per_window = 5
restart_backoff_s = 0.02
stop_grace_s = 0.05
"#,
    )
    .unwrap();
    let port = ep.port.to_string();
    let started = Instant::now();
    let (code, err) = run_bounded(
        &[
            "run",
            "--exit-on-failed",
            "--port",
            &port,
            "--config",
            config.to_str().unwrap(),
        ],
        Duration::from_secs(30),
    );
    let took = started.elapsed();
    assert_eq!(code, Some(3), "{err}");
    assert_eq!(err.matches("spawned /bin/sh").count(), 6, "{err}");
    for n in 1..=5 {
        let line = format!("restart {n} in a row (at most 5): startup_timeout\n");
        assert_eq!(err.matches(&line).count(), 1, "{line}{err}");
    }
    assert!(
        err.contains("restarting -> failed startup_timeout"),
        "{err}"
    );
    // 6 deadlines of 1.2 s and 5 backoffs of 0.02 s: 7.3 s, plus kills and scheduling.
    assert!(
        took >= Duration::from_millis(7300) && took < Duration::from_secs(15),
        "{took:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_config_names_a_missing_command_and_a_missing_log_folder() {
    let dir = temp_dir("checkfiles");
    let config = dir.join("worker.toml");
    let plain = dir.join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    // Two folders missing: not one a unit's LogsDirectory= makes in an existing parent.
    let missing_log = dir.join("no-such-parent/no-such-folder/server.log");
    let cases = [
        (
            "command = \"/nonexistent/llama-server\"".to_string(),
            "config: `command` \"/nonexistent/llama-server\" is not a file (a bare name is \
             looked up in PATH)"
                .to_string(),
        ),
        (
            format!("command = {plain:?}"),
            format!("config: `command` {} is not executable", plain.display()),
        ),
        (
            format!("command = \"/bin/sh\"\nlog_file = {missing_log:?}"),
            format!(
                "config: the folder of `log_file` does not exist: {}",
                missing_log.parent().unwrap().display()
            ),
        ),
        (
            "command = \"/bin/sh\"\nrestart_window_s = 0".to_string(),
            "config: `restart_window_s` must be greater than 0".to_string(),
        ),
    ];
    for (text, reason) in cases {
        std::fs::write(&config, &text).unwrap();
        for cmd in ["check-config", "run"] {
            let out = Command::new(BIN)
                .args([cmd, "--port", "1", "--config"])
                .arg(&config)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(2), "{cmd} {text}: {out:?}");
            assert_eq!(
                String::from_utf8(out.stderr).unwrap(),
                format!("llama-worker: {}: {reason}\n", config.display()),
                "{cmd} {text}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Before the first start: the log folder systemd's `LogsDirectory=` will make is
/// missing but its parent exists. `check-config` passes with a note naming it; `run`, which
/// needs the folder, still refuses.
#[test]
fn check_config_notes_a_log_folder_that_logs_directory_makes_at_start() {
    let dir = temp_dir("checklogsdir");
    let config = dir.join("worker.toml");
    let folder = dir.join("llama-worker");
    std::fs::write(
        &config,
        format!(
            "command = \"/bin/sh\"\nlog_file = {:?}\n",
            folder.join("server.log")
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        format!(
            "llama-worker: note: {}: config: the folder of `log_file` does not exist: {} (yet: \
             a unit's LogsDirectory= makes it at start; make it first for `run` outside systemd)\n",
            config.display(),
            folder.display()
        )
    );
    let (code, stderr) = run_bounded(
        &["run", "--port", "1", "--config", config.to_str().unwrap()],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `check-config` runs `command --version`: a binary whose shared library is
/// missing is refused with the library named, one killed by a signal or exiting 127 too; a
/// command that answers `--version` with an error of its own (`/bin/sh`) ran, and passes.
#[test]
fn check_config_runs_the_command_and_names_a_missing_library() {
    let dir = temp_dir("checkruns");
    let config = dir.join("worker.toml");
    let script = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    };
    // What ld.so prints and how it exits when libgomp1 is not installed.
    let no_lib = script(
        "no-lib",
        "echo \"$0: error while loading shared libraries: libgomp.so.1: cannot open shared \
         object file: No such file or directory\" >&2; exit 127",
    );
    let not_found = script("not-found", "echo 'something: not found' >&2; exit 127");
    let killed = script("killed", "kill -ILL $$");
    let cases = [
        (
            &no_lib,
            format!(
                "config: `command` {c} cannot start: the library libgomp.so.1 is missing (`ldd \
                 {c}` lists what it needs; docs/production.md's apt-get line installs \
                 llama-server's)",
                c = no_lib.display()
            ),
        ),
        (
            &not_found,
            format!(
                "config: `command` {c} does not run: `{c} --version` exited 127: something: not \
                 found",
                c = not_found.display()
            ),
        ),
        (
            &killed,
            format!(
                "config: `command` {c} does not run: `{c} --version` was killed by signal 4",
                c = killed.display()
            ),
        ),
    ];
    for (command, reason) in cases {
        std::fs::write(&config, format!("command = {command:?}\n")).unwrap();
        let out = Command::new(BIN)
            .args(["check-config", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            format!("llama-worker: {}: {reason}\n", config.display())
        );
    }
    std::fs::write(&config, "command = \"/bin/sh\"\n").unwrap();
    let out = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// docs/rpc.md's refused `[rpc]` configs: `check-config --port 8099` refuses each with the
/// reason `run --port 8099` gives, the local RPC server on the server's own port included
/// (which check-config once passed).
#[test]
fn check_config_refuses_every_rpc_config_that_run_refuses() {
    let dir = temp_dir("checkrpc");
    let config = dir.join("worker.toml");
    let head = "command = \"/bin/sh\"\n";
    let local = |extra: &str| format!("[[rpc.local]]\ncommand = \"/bin/sh\"\n{extra}");
    let remotes: Vec<String> = (1..=17).map(|i| format!("\"10.0.0.{i}:50052\"")).collect();
    let cases = [
        (
            "[rpc]\nremote = []\n".to_string(),
            "config: [rpc] names no endpoint: add [[rpc.local]] servers or `remote` endpoints",
        ),
        (
            format!("[rpc]\nremote = [{}]\n", remotes.join(", ")),
            "config: [rpc] names 17 endpoints, more than 16",
        ),
        (
            format!("{}[[rpc.local]]\nargs = []\n", local("")),
            "config: [[rpc.local]] entry 2 has no `command` (the ggml-rpc-server to start)",
        ),
        (
            format!("{}{}", local("port = 50052\n"), local("port = 50052\n")),
            "config: RPC port 50052 is named twice in [rpc]",
        ),
        (
            format!(
                "[rpc]\nremote = [\"127.0.0.1:50052\"]\n{}",
                local("port = 50052\n")
            ),
            "config: RPC port 50052 is named twice in [rpc]",
        ),
        (
            "[rpc]\nremote = [\"10.0.0.2:50052\", \"10.0.0.2:50052\"]\n".to_string(),
            "config: RPC port 50052 is named twice in [rpc]",
        ),
        (
            format!("{}{}", local("port = 50053\n"), local("port = 8099\n")),
            "config: [[rpc.local]] entry 2 has port 8099, the server's own --port",
        ),
        (
            "[rpc]\nremote = [\"rpc-host:50052\"]\n".to_string(),
            "config: RPC endpoint \"rpc-host:50052\" in `rpc.remote` is not ip:port (IPv6: \
             [ip]:port)",
        ),
        (
            format!("args = [\"--rpc\", \"10.0.0.2:50052\"]\n{}", local("")),
            "config: `args` hold --rpc, which the worker adds itself when [rpc] is set",
        ),
        (
            format!("args = [\"--cache-ram=0\"]\n{}", local("")),
            "config: `args` hold --cache-ram, which the worker adds itself when [rpc] is set",
        ),
        (
            local("port = 0\n"),
            "config: `rpc.local.port` must be greater than 0",
        ),
    ];
    for (rpc, reason) in cases {
        let text = format!("{head}{rpc}");
        std::fs::write(&config, &text).unwrap();
        let want = format!("llama-worker: {}: {reason}\n", config.display());
        let path = config.to_str().unwrap();
        for cmd in ["check-config", "run"] {
            let args = [cmd, "--port", "8099", "--config", path];
            // Bounded: a config run did not refuse would start the unit.
            let got = run_bounded(&args, Duration::from_secs(10));
            assert_eq!(got, (Some(2), want.clone()), "{cmd} on\n{text}");
        }
    }
    // The same local port is fine on another server port: only the clash is refused.
    let text = format!("{head}{}", local("port = 8099\n"));
    std::fs::write(&config, &text).unwrap();
    let out = Command::new(BIN)
        .args(["check-config", "--port", "8100", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(
        (out.status.code(), String::from_utf8(out.stdout).unwrap()),
        (
            Some(0),
            "rpc: /bin/sh \n/bin/sh --rpc 127.0.0.1:8099 --cache-ram 0\n".to_string()
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Starts `llama-worker run` with `config` on `ep`, stderr discarded.
fn spawn_run(config: &Path, ep: &Endpoint) -> KillOnDrop {
    KillOnDrop(
        Command::new(BIN)
            .args(["run", "--port", &ep.port.to_string(), "--config"])
            .arg(config)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

#[test]
fn the_status_socket_is_not_taken_from_a_live_worker_nor_removed_when_not_ours() {
    let ep = Endpoint::start(Mode::Ok);
    let dir = temp_dir("sockets");
    let socket = dir.join("worker.sock");
    let config = dir.join("worker.toml");
    std::fs::write(
        &config,
        format!(
            "command = \"/bin/sh\"\nargs = [\"-c\", \"sleep 300\"]\nstatus_socket = {socket:?}\n\
             startup_probe_interval_s = 0.05\nstop_grace_s = 1\n"
        ),
    )
    .unwrap();
    let mut first = spawn_run(&config, &ep);
    let s = wait_status(&socket, "ready");
    let pid = field(&s, "pid");
    // A second worker on the same socket is refused before it spawns anything.
    let (code, err) = run_bounded(
        &[
            "run",
            "--port",
            &ep.port.to_string(),
            "--config",
            config.to_str().unwrap(),
        ],
        Duration::from_secs(10),
    );
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        err,
        format!(
            "llama-worker: status socket {}: another process is listening on it\n",
            socket.display()
        )
    );
    assert_eq!(
        field(&ask(&socket, "status"), "pid"),
        pid,
        "the first one answers"
    );
    // Someone puts another socket at the path; the first worker must not remove it on exit.
    std::fs::remove_file(&socket).unwrap();
    let theirs = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    assert!(sigterm(first.0.id()));
    assert!(exit_within(&mut first, Duration::from_secs(10)).0.success());
    assert!(
        std::fs::symlink_metadata(&socket).is_ok(),
        "the worker removed a socket it did not create"
    );
    drop(theirs);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Waits until the status names a process group (a server was spawned); its id.
fn wait_pgid(socket: &Path) -> i32 {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let s = ask(socket, "status");
        if let Ok(pgid) = field(&s, "pgid").parse() {
            return pgid;
        }
        assert!(Instant::now() < end, "no server spawned: {s}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// `kill -SIG pid` through the `kill` command.
fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// Waits for `child` to exit, at most `limit`; its status and how long it took.
fn exit_within(child: &mut KillOnDrop, limit: Duration) -> (std::process::ExitStatus, Duration) {
    let start = Instant::now();
    loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            return (s, start.elapsed());
        }
        assert!(start.elapsed() < limit, "still running after {limit:?}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// A server whose group needs SIGKILL: one child ignores SIGTERM.
const STUBBORN: &str = "(trap '' TERM; sleep 301) & sleep 300 & wait";

fn write_config(dir: &Path, socket: &Path, script: &str, extra: &str) -> PathBuf {
    let config = dir.join("worker.toml");
    std::fs::write(
        &config,
        format!(
            "command = \"/bin/sh\"\nargs = [\"-c\", {script:?}]\nstatus_socket = {socket:?}\n\
             startup_probe_interval_s = 0.05\n{extra}"
        ),
    )
    .unwrap();
    config
}

#[test]
fn sigterm_sigint_sighup_and_sigquit_each_stop_cleanly() {
    let ep = Endpoint::start(Mode::Ok);
    let dir = temp_dir("signals");
    for sig in ["TERM", "INT", "HUP", "QUIT"] {
        let socket = dir.join(format!("{sig}.sock"));
        let config = write_config(&dir, &socket, STUBBORN, "stop_grace_s = 0.5\n");
        let mut child = spawn_run(&config, &ep);
        let status = wait_status(&socket, "ready");
        let pgid: i32 = field(&status, "pgid").parse().unwrap();
        wait_members(pgid, 4);
        signal(child.0.id(), sig);
        let (exit, took) = exit_within(&mut child, Duration::from_secs(5));
        assert!(exit.success(), "SIG{sig}: {exit:?}");
        // The grace (0.5 s) runs out for the child ignoring SIGTERM, then SIGKILL; the bound
        // leaves room for a loaded machine.
        assert!(took < Duration::from_secs(4), "SIG{sig}: {took:?}");
        wait_group_gone(pgid, Duration::from_secs(1));
        assert!(!socket.exists(), "SIG{sig}: socket left behind");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_second_signal_kills_the_group_without_waiting_out_the_grace() {
    let ep = Endpoint::start(Mode::Ok);
    let dir = temp_dir("second");
    let socket = dir.join("worker.sock");
    let config = write_config(&dir, &socket, STUBBORN, "stop_grace_s = 60\n");
    let mut child = KillOnDrop(
        Command::new(BIN)
            .args(["run", "--port", &ep.port.to_string(), "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let lines = {
        let (tx, rx) = std::sync::mpsc::channel();
        let err = child.0.stderr.take().unwrap();
        thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(err)) {
                let Ok(line) = line else { return };
                let _ = tx.send(line);
            }
        });
        rx
    };
    let wait_line = |want: &str| {
        let end = Instant::now() + Duration::from_secs(5);
        let mut seen = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(l) if l.contains(want) => return,
                Ok(l) => seen.push(l),
                Err(_) => panic!("no line with {want:?}; saw {seen:#?}"),
            }
        }
    };
    let status = wait_status(&socket, "ready");
    let pgid: i32 = field(&status, "pgid").parse().unwrap();
    wait_members(pgid, 4);
    signal(child.0.id(), "TERM");
    wait_line("SIGTERM: stopping the server (another signal kills it at once)");
    // The first stop waits out the 60 s grace for the child that ignores SIGTERM...
    thread::sleep(Duration::from_millis(300));
    assert!(child.0.try_wait().unwrap().is_none());
    assert_eq!(live(pgid).len(), 1, "{:?}", describe(pgid));
    // ...a second signal (any of them) ends it at once.
    let t0 = Instant::now();
    signal(child.0.id(), "INT");
    wait_line("SIGINT again: killing the server's group now");
    let (exit, _) = exit_within(&mut child, Duration::from_secs(12));
    assert!(exit.success(), "{exit:?}");
    // Far below the 60 s grace the first stop would have waited out.
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    wait_group_gone(pgid, Duration::from_secs(1));
    assert!(!socket.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `stop` (socket command or signal) is not held up by a readiness probe in flight: the probe
/// waits up to 60 s on a server that never answers, and stop ends within stop_grace_s (1 s)
/// plus a margin for a loaded machine (a stop that waited for the probe would take 60 s).
#[test]
fn stop_is_not_held_up_by_a_readiness_probe_in_flight() {
    let ep = Endpoint::start(Mode::Silent);
    let dir = temp_dir("probeinflight");
    let socket = dir.join("worker.sock");
    let config = write_config(
        &dir,
        &socket,
        STUBBORN,
        "probe_timeout_s = 60\nstop_grace_s = 1\n",
    );
    let mut child = spawn_run(&config, &ep);
    // stop_grace_s + 1 s is the promise; the rest is margin for a shared 2-core machine.
    let bound = Duration::from_secs(10);
    // The socket command: the daemon stays, the group goes.
    wait_status(&socket, "starting");
    let pgid = wait_pgid(&socket);
    wait_members(pgid, 4);
    ep.wait_hits_over(0);
    let t0 = Instant::now();
    assert_eq!(field(&ask(&socket, "stop"), "state"), "stopped");
    wait_group_gone(pgid, bound);
    assert!(t0.elapsed() < bound, "{:?}", t0.elapsed());
    // The signal: the daemon exits.
    let hits = ep.hits();
    let status = ask(&socket, "start");
    assert_eq!(field(&status, "state"), "starting");
    let pgid = wait_pgid(&socket);
    wait_members(pgid, 4);
    ep.wait_hits_over(hits);
    let t0 = Instant::now();
    signal(child.0.id(), "TERM");
    let (exit, took) = exit_within(&mut child, Duration::from_secs(10));
    assert!(exit.success(), "{exit:?}");
    assert!(took < bound, "{took:?}");
    wait_group_gone(pgid, Duration::ZERO);
    assert!(t0.elapsed() < bound);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A router whose model cannot load is not `ready`. While the router's model list says
/// the model is loading the worker stays `starting`; once it says the model's instance exited,
/// each such exit is a crash-loop event, and with the default proportions scaled down 100 times
/// the worker is `failed` after six spawns, with a reason naming the model, its exit status and
/// the log file.
#[test]
fn a_model_that_cannot_load_makes_the_worker_failed_with_its_reason() {
    let ep = Endpoint::start(Mode::ModelLoading);
    let dir = temp_dir("modelfailed");
    let socket = dir.join("worker.sock");
    let log = dir.join("server.log");
    let config = write_config(
        &dir,
        &socket,
        "sleep 300",
        &format!(
            "models = [\"m\"]\nlog_file = {log:?}\nstartup_deadline_s = 1.2\n\
             probe_interval_s = 0.05\nprobe_timeout_s = 0.5\nunready_restart_s = 0.3\n\
             cpu_probe_interval_s = 0.05\nstall_timeout_s = 1.2\nrestart_window_s = 6\n\
             max_restarts_per_window = 5\nrestart_backoff_s = 0.02\nstop_grace_s = 0.05\n"
        ),
    );
    let mut child = spawn_run(&config, &ep);
    let hits = ep.hits();
    ep.wait_hits_over(hits + 4);
    let s = ask(&socket, "status");
    assert_eq!(field(&s, "state"), "starting", "{s}");
    assert!(
        s.contains(
            "\"path\":\"/models\",\"answer\":200,\"model\":{\"id\":\"m\",\"status\":\"loading\"}"
        ),
        "{s}"
    );
    let started = Instant::now();
    ep.set(Mode::ModelFailed);
    let s = wait_status(&socket, "failed");
    let took = started.elapsed();
    assert_eq!(field(&s, "spawns"), "6", "{s}");
    assert_eq!(field(&s, "last_cause"), "model_exited", "{s}");
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    assert_eq!(
        v["reason"],
        format!(
            "crash-loop protection: 6 failures in a row (5 restarts) without 6 s ready, the last because \
             model m failed to load: its instance exited with status 1; server log: {}",
            log.display()
        ),
        "{s}"
    );
    assert_eq!(v["last_model_exit"]["model"], "m");
    assert_eq!(v["last_model_exit"]["exit_code"], 1);
    assert_eq!(v["last_model_exit"]["while_loading"], true);
    // Six probes that each see the failure at once, five backoffs of 20 ms: well under the
    // 7.3 s a never-ready server takes with the same numbers.
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(sigterm(child.0.id()));
    assert!(exit_within(&mut child, Duration::from_secs(10)).0.success());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Parses the Prometheus text the way a scraper needs it: every sample line `name value` with
/// a number, ending with `# EOF`. Returns the value of `name`.
fn sample(text: &str, name: &str) -> Option<f64> {
    assert!(text.ends_with("# EOF\n"), "cut short: {text:?}");
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (key, value) = line.rsplit_once(' ').expect(line);
        let v: f64 = value.parse().expect(line);
        if key == name {
            found = Some(v);
        }
    }
    found
}

#[test]
fn metrics_on_the_socket_end_to_end() {
    let ep = Endpoint::start(Mode::Ok);
    let dir = temp_dir("metrics");
    let socket = dir.join("worker.sock");
    let config = write_config(&dir, &socket, "sleep 300", "");
    let child = spawn_run(&config, &ep);
    wait_status(&socket, "ready");
    let out = Command::new(BIN)
        .args(["metrics", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        sample(&text, "llama_worker_state{state=\"ready\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "llama_worker_state{state=\"stopped\"}"),
        Some(0.0)
    );
    assert_eq!(sample(&text, "llama_worker_spawns_total"), Some(1.0));
    assert_eq!(
        sample(&text, "llama_worker_spawn_to_ready_seconds_count"),
        Some(1.0)
    );
    assert_eq!(sample(&text, "llama_worker_inflight_requests"), Some(0.0));
    assert_eq!(
        sample(&text, "llama_worker_restarts_total{cause=\"model_exited\"}"),
        Some(0.0)
    );
    // A stall report is counted by its verdict, and the library client reads the same text.
    assert!(ask(&socket, "stall").starts_with("{\"stall\":\"not_stalled\""));
    let text = worker_proto::metrics(&socket, Duration::from_secs(5)).unwrap();
    assert_eq!(
        sample(
            &text,
            "llama_worker_stall_verdicts_total{verdict=\"not_stalled\"}"
        ),
        Some(1.0)
    );
    drop(child); // the worker must not write into the folder while it is removed
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn metrics_file_is_rewritten_atomically_at_the_interval() {
    let ep = Endpoint::start(Mode::Ok);
    let dir = temp_dir("metrics-file");
    let socket = dir.join("worker.sock");
    let prom = dir.join("worker.prom");
    let config = write_config(
        &dir,
        &socket,
        "sleep 300",
        &format!("metrics_file = {prom:?}\nmetrics_interval_s = 0.1\n"),
    );
    let child = spawn_run(&config, &ep);
    wait_status(&socket, "ready");
    // A reader that parses the file as fast as it can while the worker rewrites it: every read
    // must be a whole file. While ready, ready_seconds_total grows, so each write differs.
    let reader = {
        let prom = prom.clone();
        thread::spawn(move || {
            let mut reads = 0u32;
            let mut versions = std::collections::BTreeSet::new();
            let end = Instant::now() + Duration::from_millis(1500);
            while Instant::now() < end {
                let text = std::fs::read_to_string(&prom).unwrap();
                let ready = sample(&text, "llama_worker_ready_seconds_total").unwrap();
                versions.insert(ready.to_bits());
                reads += 1;
            }
            (reads, versions.len())
        })
    };
    let (reads, versions) = reader.join().unwrap();
    assert!(reads > 100, "{reads} reads");
    // 1.5 s at 0.1 s: about 15 writes; a loaded machine may delay some ticks.
    assert!((5..=20).contains(&versions), "{versions} versions in 1.5 s");
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(
        leftovers.is_empty() || leftovers.len() == 1,
        "{leftovers:?}"
    );
    drop(child); // the worker must not write into the folder while it is removed
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The next watch event that is not a keep-alive.
fn next_event(w: &mut worker_proto::Watcher) -> worker_proto::WatchEvent {
    loop {
        match w.next_event().unwrap() {
            worker_proto::WatchEvent::Ping => continue,
            e => return e,
        }
    }
}

/// Generations registered on the socket, their phase and progress in the status,
/// exact answers to good and bad lines, and a stalled stream or a dead server pushed to the
/// watcher as `failed` at once.
#[test]
fn registered_generations_and_the_watch_channel_end_to_end() {
    use worker_proto::{
        call_line, done, progress, register, report_stall_of, watch, Ack, FailReason, ProgressKind,
        RegisterAnswer, StallAnswer, State, WatchEvent,
    };
    let t = Duration::from_secs(2);
    let ep = Endpoint::start(Mode::Ok);
    let dir = temp_dir("generations");
    let socket = dir.join("worker.sock");
    let config = write_config(
        &dir,
        &socket,
        "sleep 300",
        "probe_interval_s = 0.05\ncpu_probe_interval_s = 0.05\nstall_timeout_s = 0.6\n\
         restart_backoff_s = 0.05\nstop_grace_s = 0.2\n",
    );
    let child = spawn_run(&config, &ep);
    wait_status(&socket, "ready");
    let mut w = watch(&socket, t).unwrap();
    assert_eq!(next_event(&mut w), WatchEvent::Hello { watch: 1 });
    let ready1 = WatchEvent::State {
        state: State::Ready,
        spawns: 1,
    };
    assert_eq!(next_event(&mut w), ready1);
    assert_eq!(
        register(&socket, 0, Some(1), t).unwrap(),
        RegisterAnswer::Registered(1)
    );
    assert_eq!(
        register(&socket, 1, Some(1), t).unwrap(),
        RegisterAnswer::Registered(2)
    );
    // A second client (two daemons on one server): the slots watch 1 holds are
    // refused to it, another one is not, and its registrations go with its connection.
    let mut other = watch(&socket, t).unwrap();
    assert_eq!(next_event(&mut other), WatchEvent::Hello { watch: 2 });
    assert_eq!(
        register(&socket, 0, Some(2), t).unwrap(),
        RegisterAnswer::SlotTaken
    );
    assert_eq!(
        register(&socket, 0, None, t).unwrap(),
        RegisterAnswer::SlotTaken
    );
    assert_eq!(
        register(&socket, 5, Some(2), t).unwrap(),
        RegisterAnswer::Registered(3)
    );
    assert_eq!(field(&ask(&socket, "status"), "inflight"), "3");
    // (That a closed watch takes its registrations along is tested on the fake clock.)
    assert_eq!(done(&socket, 3, t).unwrap(), Ack::Ok);
    drop(other);
    let s = ask(&socket, "status");
    assert!(
        s.contains(
            ",\"generations\":[{\"id\":1,\"slot\":0,\"phase\":\"prefill\",\"progress_age_s\":"
        ),
        "{s}"
    );
    assert_eq!(
        progress(&socket, 1, ProgressKind::FirstByte, t).unwrap(),
        Ack::Ok
    );
    assert_eq!(done(&socket, 2, t).unwrap(), Ack::Ok);
    assert_eq!(done(&socket, 2, t).unwrap(), Ack::Unknown);
    assert_eq!(
        progress(&socket, 99, ProgressKind::Bytes, t).unwrap(),
        Ack::Unknown
    );
    let streamed_at = Instant::now();
    assert!(matches!(
        report_stall_of(&socket, 1, t).unwrap(),
        StallAnswer::NotStalled { .. }
    ));
    for (line, reply) in [
        (
            "register x",
            "{\"error\":\"slot is not a number in range\"}",
        ),
        (
            "progress 1 tokens",
            "{\"error\":\"progress kind must be first_byte or bytes\"}",
        ),
        ("done", "{\"error\":\"missing argument: id\"}"),
        ("done 1 2", "{\"error\":\"too many arguments\"}"),
        (
            "bogus",
            "{\"error\":\"unknown command; use status, start, stop, stall or metrics\"}",
        ),
    ] {
        assert_eq!(call_line(&socket, line, t).unwrap(), reply, "{line}");
    }
    let s = ask(&socket, "status");
    assert!(
        s.contains("{\"id\":1,\"slot\":0,\"phase\":\"streaming\""),
        "{s}"
    );
    // Generation 1 streams nothing more: the worker restarts on its own at stall_timeout_s
    // and pushes the failure before the state.
    assert_eq!(
        next_event(&mut w),
        WatchEvent::Failed {
            id: 1,
            reason: FailReason::WorkerRestarted
        }
    );
    let took = streamed_at.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    assert!(matches!(
        next_event(&mut w),
        WatchEvent::State {
            state: State::Restarting,
            ..
        }
    ));
    let ready2 = WatchEvent::State {
        state: State::Ready,
        spawns: 2,
    };
    assert_eq!(next_event(&mut w), ready2);
    let s = ask(&socket, "status");
    assert_eq!(field(&s, "last_cause"), "stall");
    assert_eq!(field(&s, "inflight"), "0");
    // A server that dies under a registered generation: `server_died`, at once.
    assert_eq!(
        register(&socket, 3, Some(1), t).unwrap(),
        RegisterAnswer::Registered(4)
    );
    let pid: u32 = field(&s, "pid").parse().unwrap();
    signal(pid, "KILL");
    assert_eq!(
        next_event(&mut w),
        WatchEvent::Failed {
            id: 4,
            reason: FailReason::ServerDied
        }
    );
    assert_eq!(field(&ask(&socket, "status"), "last_cause"), "exited");
    drop(child);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `stop` and `start` are answered only once every open watch has written the state they set:
/// a client that heard the answer reads that state from its watch without waiting, so what it
/// admits next cannot go by the state before (loopd's admission trusts its watch on that).
#[test]
fn the_state_a_command_set_is_on_every_watch_before_its_answer() {
    use worker_proto::{call, watch, Command, State, WatchEvent};
    let t = Duration::from_secs(2);
    let ep = Endpoint::start(Mode::Ok);
    let dir = temp_dir("state-before-answer");
    let socket = dir.join("worker.sock");
    let config = write_config(
        &dir,
        &socket,
        "sleep 300",
        "probe_interval_s = 0.05\nrestart_backoff_s = 0.05\nstop_grace_s = 0.2\n",
    );
    let child = spawn_run(&config, &ep);
    wait_status(&socket, "ready");
    let mut watches: Vec<_> = (0..2).map(|_| watch(&socket, t).unwrap()).collect();
    for w in &mut watches {
        assert!(matches!(next_event(w), WatchEvent::Hello { .. }));
        assert!(matches!(
            next_event(w),
            WatchEvent::State {
                state: State::Ready,
                ..
            }
        ));
    }
    // The state lines each watch holds right now, read without waiting.
    let held = |w: &mut worker_proto::Watcher| -> Vec<State> {
        w.get_ref().set_nonblocking(true).unwrap();
        let mut states = Vec::new();
        while let Ok(e) = w.next_event() {
            if let WatchEvent::State { state, .. } = e {
                states.push(state);
            }
        }
        w.get_ref().set_nonblocking(false).unwrap();
        states
    };
    for round in 0..20 {
        for (command, after) in [
            (Command::Stop, State::Stopped),
            (Command::Start, State::Starting),
        ] {
            let answer = call(&socket, command, t).unwrap();
            assert!(
                answer.contains(&format!("\"state\":\"{}\"", after.as_str())),
                "{answer}"
            );
            for (k, w) in watches.iter_mut().enumerate() {
                let states = held(w);
                assert_eq!(
                    states.first(),
                    Some(&after),
                    "round {round}, watch {k}: after `{}` answered, it held {states:?}",
                    command.as_str()
                );
            }
            if command == Command::Start {
                wait_status(&socket, "ready");
                for w in &mut watches {
                    // `ready` pushed in its time; drained for the next round.
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while !held(w).contains(&State::Ready) {
                        assert!(Instant::now() < deadline, "round {round}: no ready line");
                        thread::sleep(Duration::from_millis(5));
                    }
                }
            }
        }
    }
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}
