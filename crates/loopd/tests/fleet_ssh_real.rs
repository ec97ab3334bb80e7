//! `loopd serve` over two real hosts, host b reached the way a GPU box is in production:
//! through OpenSSH's Unix-socket forwarding, with the ssh command line of
//! `docs/loopd-tunnel@.service` against a user-mode sshd on loopback running the settings of
//! `docs/loopd-tunnel.sshd.conf` (`scripts/tunnel.sh`, which installs openssh when it is
//! missing). Host b's llama-server stays on its loopback port and its worker socket stays
//! where it is; loopd opens only the two forwarded Unix sockets.
//!
//! A request runs on b through the tunnel; the ssh is killed mid-stream (a partition): b's
//! request ends `host_lost` with its output and a takes the next submit; the same ssh line
//! again (the unit's restart) brings b back, and its session goes back there.

mod fleet_support;
mod real_serve;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fleet_support::{
    assert_failed_with_output, completed_on, wait_host, wait_ready_line, Followed,
};
use llama_harness::{temp_dir, workspace_root, LocalServer, Proxy};
use loopd_client::llama::Client;
use loopd_client::selftest::SAMPLING;
use loopd_client::ClientConfig;
use real_serve::start_serve;

const LONG: &str = "Count from 1 to 300, one number per line.";

/// `scripts/tunnel.sh start DIR pairs...`: its lines (`sshd PID PORT`, `ssh PID`).
fn tunnel(args: &[&str]) -> String {
    let out = Command::new(workspace_root().join("scripts/tunnel.sh"))
        .args(args)
        .output()
        .expect("scripts/tunnel.sh");
    assert!(
        out.status.success(),
        "scripts/tunnel.sh {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ssh_pid(said: &str) -> u32 {
    said.lines()
        .find_map(|l| l.strip_prefix("ssh "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ssh pid in {said:?}"))
}

/// Stops the tunnel's sshd and ssh when the test ends, passing or not.
struct Tunnel(PathBuf);

impl Drop for Tunnel {
    fn drop(&mut self) {
        let _ = Command::new(workspace_root().join("scripts/tunnel.sh"))
            .arg("stop")
            .arg(&self.0)
            .output();
    }
}

fn write_config(dir: &Path, a: (&LocalServer, &Proxy), b: (&Path, &Path)) -> (PathBuf, PathBuf) {
    let props = Client::new(ClientConfig::new(a.1.socket(), a.0.model()))
        .props()
        .expect("GET /props through a's inferproxy");
    let socket = dir.join("loopd.sock");
    let config = dir.join("loopd.toml");
    let host = |name: &str, infer: &Path, worker: &Path| {
        format!(
            "[[host]]\nname = {name:?}\ninfer_socket = {:?}\nworker_socket = {:?}\nslots = [0, 1]\n",
            infer.display().to_string(),
            worker.display().to_string()
        )
    };
    std::fs::write(
        &config,
        format!(
            "socket = {:?}\nmodel = {:?}\n\
             [sampling]\ntemperature = 0.0\nseed = {}\n\
             [daemon]\nsocket = {:?}\n\
             [expect]\nchat_template_sha256 = \"{}\"\nn_ctx = {}\ntotal_slots = {}\n{}{}",
            a.1.socket().display().to_string(),
            a.0.model(),
            SAMPLING.seed.unwrap(),
            socket.display().to_string(),
            llama_proto::hash::sha256(props.chat_template.as_bytes()).unwrap(),
            props.n_ctx,
            props.total_slots,
            host("a", a.1.socket(), a.0.status_socket()),
            host("b", b.0, b.1),
        ),
    )
    .unwrap();
    (config, socket)
}

#[test]
fn host_b_through_a_user_mode_sshd_partitioned_and_rejoined() {
    let dir = temp_dir("fleet-ssh");
    let (a, b) = std::thread::scope(|s| {
        let ta = s.spawn(LocalServer::start);
        let tb = s.spawn(LocalServer::start);
        (ta.join().unwrap(), tb.join().unwrap())
    });
    let a_proxy = Proxy::start(a.addr());
    // The tunnel's local ends, in a folder of the test's own (ssh leaves the files).
    let ends = dir.join("b");
    std::fs::create_dir_all(&ends).unwrap();
    let (infer, status) = (ends.join("infer.sock"), ends.join("status.sock"));
    let tunnel_dir = dir.join("tunnel");
    let pairs = [
        format!("{}=127.0.0.1:{}", infer.display(), b.addr().port()),
        format!("{}={}", status.display(), b.status_socket().display()),
    ];
    let start = |pairs: &[String; 2]| {
        let mut args = vec!["start", tunnel_dir.to_str().unwrap()];
        args.extend(pairs.iter().map(String::as_str));
        tunnel(&args)
    };
    let said = start(&pairs);
    let _tunnel = Tunnel(tunnel_dir.clone());
    let ssh = ssh_pid(&said);

    let (config, socket) = write_config(&dir, (&a, &a_proxy), (&infer, &status));
    let folder = temp_dir("fleet-ssh-folder");
    let (_serve, log) = start_serve(&config, &folder, &dir);
    wait_ready_line(&log, "hosts a, b");
    wait_host(&socket, "b", "ready", Duration::from_secs(30));

    // Hold a's first slot so the session's first request goes to b, the most free host.
    let mut hold_a = Followed::submit(&socket, LONG, 600, Some("hold-a"));
    assert_eq!(hold_a.placed_on(), "a");
    completed_on(&socket, Some("tunnelled"), "b");
    // Mid-stream on b, the ssh dies.
    let mut on_b = Followed::submit(&socket, LONG, 600, Some("tunnelled"));
    assert_eq!(on_b.placed_on(), "b", "the session goes back to b");
    on_b.first_content();
    let cut = Instant::now();
    assert!(Command::new("kill")
        .args(["-KILL", &ssh.to_string()])
        .status()
        .unwrap()
        .success());
    let (at, r) = on_b.result(Duration::from_secs(30));
    assert_failed_with_output(&r, &["host_lost"], "b");
    wait_host(&socket, "b", "lost", Duration::from_secs(10));
    completed_on(&socket, None, "a");
    // The unit's restart: the same line again, over the files the dead ssh left.
    start(&pairs);
    wait_host(&socket, "b", "ready", Duration::from_secs(30));
    completed_on(&socket, Some("tunnelled"), "b");
    fleet_support::call(
        &socket,
        &serde_json::json!({"cmd": "cancel", "id": hold_a.id}),
    );
    hold_a.result(Duration::from_secs(60));
    eprintln!(
        "ssh tunnel: killed ssh to host_lost {} ms",
        at.duration_since(cut).as_millis()
    );
    let _ = std::fs::remove_dir_all(&folder);
}
