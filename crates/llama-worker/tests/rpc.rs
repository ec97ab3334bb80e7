//! The RPC unit with stand-ins: `python3` listeners for `ggml-rpc-server`, a test TCP listener
//! for a remote host, `sh` for llama-server (its readiness answered by a test endpoint). The
//! server is spawned only once every endpoint accepts, with `--rpc` and `--cache-ram 0`; a
//! local RPC server's death restarts the whole unit and leaves no process of the old one; a
//! remote endpoint that refuses keeps the worker not ready with the endpoint in its reason.

mod common;

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

use common::{config, live, state, tick_until, wait_group_gone, Endpoint, Mode};
use llama_worker::{Config, ConfigError, Refusal, RestartCause, State, SystemClock, Worker};

const T: Duration = Duration::from_secs(10);

/// A stand-in `ggml-rpc-server`: listens on the port given as its argument and, like the real
/// one, accepts one client at a time (a probe closes at once), with a backlog of 1.
const RPC_STAND_IN: &str = "import socket, sys\n\
s = socket.socket()\n\
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
s.bind(('127.0.0.1', int(sys.argv[1])))\n\
s.listen(1)\n\
while True: c, _ = s.accept(); c.recv(1); c.close()\n";

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lw-rpc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A server stand-in that writes its arguments (the ones the worker appended) to `args_file`
/// and sleeps; with the test config's small numbers and `rpc` appended as TOML.
fn unit_config(args_file: &std::path::Path, rpc: &str) -> Config {
    let base = config(&format!(
        "echo \"$0 $*\" > {}; exec sleep 600",
        args_file.display()
    ));
    let mut text = toml_of(&base);
    if rpc.contains("startup_deadline_s") {
        text = text.replace("startup_deadline_s = 5\n", "");
    }
    text.push_str(rpc);
    Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The test config back as TOML (only the keys `common::config` sets).
fn toml_of(c: &Config) -> String {
    format!(
        "command = {:?}\nargs = {:?}\nstartup_deadline_s = 5\nstartup_probe_interval_s = 0.05\n\
         probe_interval_s = 0.1\nprobe_timeout_s = 0.2\nunready_restart_s = 1.5\n\
         cpu_probe_interval_s = 0.25\nstall_timeout_s = 1\nrestart_window_s = 60\n\
         max_restarts_per_window = 3\nrestart_backoff_s = 0.2\nstop_grace_s = 0.5\n",
        c.command, c.args
    )
}

fn local_rpc(n: usize) -> String {
    "[[rpc.local]]\ncommand = \"python3\"\nargs = [\"-c\", RPC, \"{rpc_port}\"]\n"
        .replace("RPC", &format!("{RPC_STAND_IN:?}"))
        .repeat(n)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_remote_endpoint_that_refuses_keeps_the_worker_not_ready_until_it_comes_up() {
    let dir = scratch("remote");
    let args = dir.join("args");
    let remote = free_port();
    let c = unit_config(
        &args,
        &format!("[rpc]\nremote = [\"127.0.0.1:{remote}\"]\n"),
    );
    let ep = Endpoint::start(Mode::Ok);
    let mut w = Worker::new(c, ep.port, SystemClock::new()).unwrap();
    let h = w.handle();
    h.start();
    let endpoint = format!("127.0.0.1:{remote} (remote)");
    let waiting = tick_until(&mut w, T, |w| {
        w.handle()
            .status()
            .reason
            .is_some_and(|r| r.contains(&endpoint))
    });
    let s = h.status();
    assert!(waiting, "no reason naming {endpoint}: {}", s.to_json());
    assert_eq!(
        s.reason.as_deref(),
        Some(
            format!("waiting for RPC endpoint {endpoint} to accept connections: refused").as_str()
        )
    );
    assert!(s.to_json().contains(&format!(
        "\"rpc\":[{{\"endpoint\":\"127.0.0.1:{remote}\",\"place\":\"remote\",\"pid\":null,\
         \"pgid\":null,\"up\":false,\"answer\":\"refused\"}}]"
    )));
    assert_eq!(s.state, State::Starting);
    assert_eq!(
        s.spawns, 0,
        "the server is not spawned while an endpoint is down"
    );
    assert!(matches!(h.admit(), Err(Refusal::NotReady)));
    // Longer than the startup deadline (5 s) would be... not a restart: still waiting, the
    // count untouched. Checked over a few probe rounds here; the policy tests cover the hour.
    assert!(!tick_until(&mut w, Duration::from_millis(600), |w| {
        w.handle().status().spawns > 0
    }));
    assert_eq!(h.status().total_restarts, 0);

    // The remote host comes up: the server is spawned with --rpc and --cache-ram 0.
    let _host = TcpListener::bind(("127.0.0.1", remote)).unwrap();
    let ready = tick_until(&mut w, T, |w| state(w) == State::Ready);
    let s = h.status();
    assert!(ready, "not ready once the remote accepts: {}", s.to_json());
    assert_eq!((s.reason, s.spawns), (None, 1));
    let got = std::fs::read_to_string(&args).unwrap();
    assert_eq!(
        got.trim(),
        format!("--rpc 127.0.0.1:{remote} --cache-ram 0"),
        "the server's appended arguments"
    );
    h.stop();
    w.tick();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_local_rpc_server_killed_restarts_the_whole_unit_and_nothing_old_survives() {
    let dir = scratch("local");
    let args = dir.join("args");
    let c = unit_config(&args, &local_rpc(2));
    let ep = Endpoint::start(Mode::Ok);
    let mut w = Worker::new(c, ep.port, SystemClock::new()).unwrap();
    let h = w.handle();
    h.start();
    let ready = tick_until(&mut w, T, |w| state(w) == State::Ready);
    let s = h.status();
    assert!(ready, "not ready: {}", s.to_json());
    assert_eq!(s.rpc.len(), 2);
    let ports: Vec<u16> = s.rpc.iter().map(|e| e.addr.port()).collect();
    assert_ne!(ports[0], ports[1]);
    assert_eq!(
        std::fs::read_to_string(&args).unwrap().trim(),
        format!(
            "--rpc 127.0.0.1:{},127.0.0.1:{} --cache-ram 0",
            ports[0], ports[1]
        )
    );
    // The old unit: the server's group and each RPC server's group.
    let mut old: Vec<i32> = s.rpc.iter().map(|e| e.pgid.unwrap()).collect();
    old.push(s.pgid.unwrap());
    let victim = s.rpc[1].pid.unwrap();
    let mut work = h.admit().unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &victim.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let restarted = tick_until(&mut w, T, |w| {
        w.handle().status().last_cause == Some(RestartCause::RpcExited)
    });
    let s = h.status();
    assert!(restarted, "no rpc_exited restart: {}", s.to_json());
    assert_eq!(
        work.wait_failure(T),
        Some(llama_worker::FailReason::ServerDied)
    );
    let lost = s.rpc_lost.clone().expect("the lost endpoint");
    assert_eq!(lost.endpoint, format!("127.0.0.1:{} (local)", ports[1]));
    assert_eq!(lost.what, "signal: 9 (SIGKILL)");
    for g in &old {
        assert_eq!(live(*g), Vec::<i32>::new(), "group {g} of the old unit");
    }
    let back = tick_until(&mut w, T, |w| state(w) == State::Ready);
    let s = h.status();
    assert!(back, "not ready again: {}", s.to_json());
    assert_eq!(s.total_restarts, 1, "{}", s.to_json());
    let new: Vec<i32> = s.rpc.iter().map(|e| e.pgid.unwrap()).collect();
    assert!(new.iter().all(|g| !old.contains(g)), "{new:?} {old:?}");
    h.stop();
    w.tick();
    for g in new.iter().chain([&s.pgid.unwrap()]) {
        wait_group_gone(*g, Duration::from_secs(2));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_local_rpc_server_that_never_listens_restarts_at_the_deadline() {
    let dir = scratch("deaf");
    let c = unit_config(
        &dir.join("args"),
        "startup_deadline_s = 0.5\n[[rpc.local]]\ncommand = \"sleep\"\nargs = [\"600\"]\n",
    );
    let ep = Endpoint::start(Mode::Ok);
    let mut w = Worker::new(c, ep.port, SystemClock::new()).unwrap();
    let h = w.handle();
    h.start();
    let restarted = tick_until(&mut w, T, |w| {
        w.handle().status().last_cause == Some(RestartCause::RpcStartupTimeout)
    });
    let s = h.status();
    assert!(restarted, "{}", s.to_json());
    assert_eq!(
        s.spawns,
        1,
        "only the RPC server was spawned: {}",
        s.to_json()
    );
    h.stop();
    w.tick();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_fixed_rpc_port_equal_to_the_server_port_is_refused() {
    let c = Config::from_toml(
        "command = \"x\"\n[[rpc.local]]\ncommand = \"ggml-rpc-server\"\nport = 50052\n",
    )
    .unwrap();
    assert_eq!(
        Worker::new(c.clone(), 50052, SystemClock::new()).err(),
        Some(ConfigError::RpcServerPort(1, 50052))
    );
    assert_eq!(
        c.validate_for_port(50052),
        Err(ConfigError::RpcServerPort(1, 50052))
    );
    assert_eq!(c.validate_for_port(50053), Ok(()));
}

/// `check-config` shows what the worker would run: each local RPC server (a port chosen at
/// each start as its placeholder), then the server with `--rpc` and `--cache-ram 0`.
#[test]
fn check_config_prints_the_rpc_servers_and_the_appended_server_arguments() {
    let dir = scratch("check");
    let config = dir.join("worker.toml");
    std::fs::write(
        &config,
        "command = \"/bin/sh\"\nargs = [\"-c\", \"exit 0\"]\n[rpc]\nremote = [\"10.0.0.2:50052\"]\n\
         [[rpc.local]]\ncommand = \"/bin/sh\"\nargs = [\"-p\", \"{rpc_port}\"]\n\
         [[rpc.local]]\ncommand = \"/bin/sh\"\nargs = [\"-p\", \"{rpc_port}\"]\nport = 50053\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llama-worker"))
        .args(["check-config", "--port", "8099", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "rpc: /bin/sh -p {rpc_port}\nrpc: /bin/sh -p 50053\n/bin/sh -c exit 0 --rpc \
         127.0.0.1:{rpc_port},127.0.0.1:50053,10.0.0.2:50052 --cache-ram 0\n"
    );
    // A local server whose command does not exist is refused, named.
    std::fs::write(
        &config,
        "command = \"/bin/sh\"\n[[rpc.local]]\ncommand = \"/nonexistent/ggml-rpc-server\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llama-worker"))
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("\"/nonexistent/ggml-rpc-server\" is not a file"),
        "{out:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
