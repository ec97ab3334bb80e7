//! The real `loopd serve` binary started for a real-stack test, and waited for as systemd
//! would: until it says `READY=1` on a `NOTIFY_SOCKET` (after its self-test).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use llama_harness::{LocalServer, Proxy};
use loopd_client::llama::Client;
use loopd_client::selftest::SAMPLING;
use loopd_client::ClientConfig;

/// Writes `dir/loopd.toml` for `loopd serve` on `server` through `proxy`: greedy sampling with
/// the self-test's seed, the worker's status socket, the daemon's socket `dir/loopd.sock`, the
/// `[expect]` the server itself reports, and the test's own `limits` and `runner` lines.
/// Returns the config's path and the daemon's socket.
// `make chaos` writes a config of its own, on its scaled timers.
#[allow(dead_code)]
pub fn write_config(
    dir: &Path,
    server: &LocalServer,
    proxy: &Proxy,
    limits: &str,
    runner: &str,
) -> (PathBuf, PathBuf) {
    let props = Client::new(ClientConfig::new(proxy.socket(), server.model()))
        .props()
        .expect("GET /props through inferproxy");
    let socket = dir.join("loopd.sock");
    let config = dir.join("loopd.toml");
    std::fs::write(
        &config,
        format!(
            "socket = {:?}\nmodel = {:?}\n\
             [limits]\n{limits}\n\
             [sampling]\ntemperature = 0.0\nseed = {}\n\
             [runner]\nworker_socket = {:?}\n{runner}\n\
             [daemon]\nsocket = {:?}\n\
             [expect]\nchat_template_sha256 = \"{}\"\nn_ctx = {}\ntotal_slots = {}\n",
            proxy.socket().display().to_string(),
            server.model(),
            SAMPLING.seed.unwrap(),
            server.status_socket().display().to_string(),
            socket.display().to_string(),
            llama_proto::hash::sha256(props.chat_template.as_bytes()).unwrap(),
            props.n_ctx,
            props.total_slots,
        ),
    )
    .unwrap();
    (config, socket)
}

/// `loopd serve`, killed and reaped when dropped.
pub struct Serve(pub Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `loopd serve --config config --folder folder` with its stderr appended to `dir/serve.log`
/// and its store in `dir` (`STATE_DIRECTORY`, unless the config names one), and returns once
/// it said `READY=1`; panics with what it said otherwise.
pub fn start_serve(config: &Path, folder: &Path, dir: &Path) -> (Serve, PathBuf) {
    let notify_path = dir.join("notify.sock");
    let log = dir.join("serve.log");
    // A daemon started again in the same directory (make chaos) binds afresh and logs on.
    let _ = std::fs::remove_file(&notify_path);
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let mut serve = Serve(
        Command::new(env!("CARGO_BIN_EXE_loopd"))
            .args(["serve", "--config"])
            .arg(config)
            .arg("--folder")
            .arg(folder)
            .env("NOTIFY_SOCKET", &notify_path)
            .env("STATE_DIRECTORY", dir)
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            )
            .spawn()
            .unwrap(),
    );
    // The self-test runs three generations first: minutes on a loaded 2-core box. Polled each
    // second, so a daemon that refused to start is reported at once, not at the deadline.
    notify
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(900);
    let mut buf = [0u8; 256];
    let ready = loop {
        match notify.recv(&mut buf) {
            Ok(n) => break Ok(String::from_utf8_lossy(&buf[..n]).trim_end().to_owned()),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                if let Ok(Some(status)) = serve.0.try_wait() {
                    break Err(format!("it exited ({status}) before READY=1"));
                }
                if std::time::Instant::now() > deadline {
                    break Err("no READY=1 within 900 s".to_owned());
                }
            }
            Err(e) => break Err(e.to_string()),
        }
    };
    if !matches!(ready.as_deref(), Ok("READY=1")) {
        let _ = serve.0.kill();
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        panic!("loopd serve never said READY=1 ({ready:?}); it said:\n{said}");
    }
    (serve, log)
}

/// [`start_serve`] with its folder `dir/folder`, made here: the tests whose tools read nothing.
#[allow(dead_code)]
pub fn start_serve_in(config: &Path, dir: &Path) -> (Serve, PathBuf) {
    let folder = dir.join("folder");
    std::fs::create_dir(&folder).unwrap();
    start_serve(config, &folder, dir)
}

/// One command to the daemon on `socket` and its one-line reply, waited for up to 15 minutes.
#[allow(dead_code)]
pub fn call(socket: &Path, cmd: &serde_json::Value) -> serde_json::Value {
    let s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(900))).unwrap();
    (&s).write_all(format!("{cmd}\n").as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}
