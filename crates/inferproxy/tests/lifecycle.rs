//! The binary's command line, its socket file, and its start and stop.

mod support;

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;

use support::*;

fn os<'a>(args: &[&'a str]) -> Vec<&'a OsStr> {
    args.iter().map(|a| OsStr::new(*a)).collect()
}

#[test]
fn help_and_version_exit_zero() {
    let (status, out, err) = run_to_exit(&os(&["--help"]));
    assert_eq!(status.code(), Some(0));
    assert!(out.starts_with(
        "usage: inferproxy --listen <socket path> --upstream <host:port> \
         [--socket-mode 0600|0660]\n"
    ));
    assert_eq!(err, "");
    let (status, out, err) = run_to_exit(&os(&["--version"]));
    assert_eq!(status.code(), Some(0));
    assert_eq!(out, "inferproxy 0.1.0\n");
    assert_eq!(err, "");
}

#[test]
fn help_names_every_flag() {
    for help in ["--help", "-h"] {
        let (status, out, err) = run_to_exit(&os(&[help]));
        assert_eq!(status.code(), Some(0), "{help}");
        assert_eq!(err, "");
        for flag in [
            "--listen <path>",
            "--upstream <host:port>",
            "--socket-mode <mode>",
            "--help",
            "--version",
        ] {
            assert!(out.contains(flag), "{help} does not name {flag}:\n{out}");
        }
    }
}

#[test]
fn bad_arguments_exit_two_with_one_line_naming_them() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--listne", "x"],
            "inferproxy: unknown argument `--listne` (see --help)\n",
        ),
        (&[], "inferproxy: --listen is required (see --help)\n"),
        (
            &["--listen", "/tmp/x"],
            "inferproxy: --upstream is required (see --help)\n",
        ),
        (
            &["--listen", "/tmp/x", "--upstream"],
            "inferproxy: --upstream needs a value\n",
        ),
        (
            &["--listen", "/tmp/x", "--upstream", "localhost"],
            "inferproxy: --upstream `localhost` is not host:port with a port from 1 to 65535\n",
        ),
    ];
    for (args, want) in cases {
        let (status, out, err) = run_to_exit(&os(args));
        assert_eq!(status.code(), Some(2), "{args:?}");
        assert_eq!(out, "");
        assert_eq!(err, *want);
    }
}

#[test]
fn socket_is_mode_0600() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("infer.sock");
    let up = Upstream::start(echo);
    let _proxy = Proxy::start(&path, &up.addr);
    let meta = fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    // The staging name is gone once the socket is in place.
    assert!(!dir.join("infer.sock.new").exists());
}

/// `--socket-mode 0660`: the socket's group (the process's primary group) may connect too, so a
/// loopd running as another user of that group reaches it (docs/production.md).
#[test]
fn socket_mode_0660_lets_the_group_in() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("infer.sock");
    let up = Upstream::start(echo);
    let _proxy = Proxy::start_with_mode(&path, &up.addr, "0660");
    let meta = fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o660);
    assert_eq!(ping(&mut client(&path)), Probe::Forwarded);
}

#[test]
fn stale_socket_is_replaced() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("infer.sock");
    drop(UnixListener::bind(&path).unwrap()); // leaves a socket file nobody listens on
    assert!(fs::symlink_metadata(&path).unwrap().file_type().is_socket());
    let up = Upstream::start(echo);
    let _proxy = Proxy::start(&path, &up.addr);
    assert_eq!(ping(&mut client(&path)), Probe::Forwarded);
}

#[test]
fn stale_staging_socket_is_replaced() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("infer.sock");
    drop(UnixListener::bind(dir.join("infer.sock.new")).unwrap());
    let up = Upstream::start(echo);
    let _proxy = Proxy::start(&path, &up.addr);
    assert_eq!(ping(&mut client(&path)), Probe::Forwarded);
}

#[test]
fn regular_file_is_refused_and_kept() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("infer.sock");
    fs::write(&path, b"precious").unwrap();
    let (status, out, err) = run_to_exit(&[
        OsStr::new("--listen"),
        path.as_os_str(),
        OsStr::new("--upstream"),
        OsStr::new("127.0.0.1:9"),
    ]);
    assert_eq!(status.code(), Some(1));
    assert_eq!(out, "");
    let want = format!(
        "inferproxy: {}: exists and is not a socket; not removing it\n",
        path.display()
    );
    assert_eq!(err, want);
    assert_eq!(fs::read(&path).unwrap(), b"precious");
}

#[test]
fn live_listener_is_refused_and_left_working() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("infer.sock");
    let live = UnixListener::bind(&path).unwrap();
    let (status, _, err) = run_to_exit(&[
        OsStr::new("--listen"),
        path.as_os_str(),
        OsStr::new("--upstream"),
        OsStr::new("127.0.0.1:9"),
    ]);
    assert_eq!(status.code(), Some(1));
    let want = format!(
        "inferproxy: {}: another process is listening on it\n",
        path.display()
    );
    assert_eq!(err, want);
    // The probe connection is the only thing that reached the live listener.
    let (mut probe, _) = live.accept().unwrap();
    let mut rest = Vec::new();
    probe.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"");
    assert!(fs::symlink_metadata(&path).unwrap().file_type().is_socket());
}

#[test]
fn second_instance_on_the_same_path_is_refused() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("infer.sock");
    let up = Upstream::start(echo);
    let _first = Proxy::start(&path, &up.addr);
    let (status, _, err) = run_to_exit(&[
        OsStr::new("--listen"),
        path.as_os_str(),
        OsStr::new("--upstream"),
        OsStr::new(&up.addr),
    ]);
    assert_eq!(status.code(), Some(1));
    assert!(
        err.ends_with(": another process is listening on it\n"),
        "{err}"
    );
}

#[test]
fn kill_9_then_restart_on_the_same_path() {
    let _s = serial();
    let dir = TempDir::new();
    let path = dir.join("infer.sock");
    let up = Upstream::start(echo);
    let mut first = Proxy::start(&path, &up.addr);
    let mut held = client(&path);
    assert_eq!(ping(&mut held), Probe::Forwarded);
    first.child.kill().unwrap(); // SIGKILL: no cleanup runs
    first.child.wait().unwrap();
    assert!(fs::symlink_metadata(&path).unwrap().file_type().is_socket());
    // The client of the killed process sees its connection end.
    let mut rest = Vec::new();
    held.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"");
    let _second = Proxy::start(&path, &up.addr);
    assert_eq!(ping(&mut client(&path)), Probe::Forwarded);
}

fn stops_cleanly_on(signal: &str) {
    let dir = TempDir::new();
    let path = dir.join("infer.sock");
    let up = Upstream::start(echo);
    let mut proxy = Proxy::start(&path, &up.addr);
    let mut held = client(&path);
    assert_eq!(ping(&mut held), Probe::Forwarded);
    proxy.signal(signal);
    let status = proxy.wait_exit(PATIENCE).expect("exit after the signal");
    assert_eq!(status.code(), Some(0), "{signal}");
    assert!(!path.exists(), "socket file removed on {signal}");
    assert!(!dir.join("infer.sock.new").exists());
    let mut rest = Vec::new();
    held.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"", "open connection closed on {signal}");
    assert_eq!(
        proxy.lines_until_quiet(std::time::Duration::from_millis(200)),
        Vec::<String>::new()
    );
}

#[test]
fn sigterm_removes_the_socket_and_exits_zero() {
    let _s = serial();
    stops_cleanly_on("TERM");
}

#[test]
fn sigint_removes_the_socket_and_exits_zero() {
    let _s = serial();
    stops_cleanly_on("INT");
}

#[test]
fn sighup_and_sigquit_remove_the_socket_and_exit_zero_as_llama_worker_does() {
    let _s = serial();
    stops_cleanly_on("HUP");
    stops_cleanly_on("QUIT");
}
