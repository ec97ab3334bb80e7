//! The local stack the bench measures: llama-server's router under llama-worker
//! (`scripts/serve.sh`, with `/metrics` on), inferproxy in front of it, and `loopd serve` on
//! inferproxy, started as systemd would and waited for until it says `READY=1`.
//!
//! The binaries: `$LLAMA_WORKER_BIN`, `$INFERPROXY_BIN` and `$LOOPD_BIN` when set (`make
//! bench-e2e` sets them to release builds), else the workspace's debug builds.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use llama_harness::{temp_dir, workspace_artifact, LocalServer, Proxy};
use loopd::config::Config;
use loopd_client::llama::Client;
use loopd_client::selftest::SAMPLING;
use loopd_client::ClientConfig;

/// How long `loopd serve` may take to say `READY=1` (its self-test runs three generations,
/// minutes on a loaded 2-core box).
const READY_TIMEOUT: Duration = Duration::from_secs(900);
/// How long `loopd serve` gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The three daemons, stopped when dropped.
pub struct Stack {
    /// `loopd serve`; dropped first.
    daemon: Daemon,
    /// inferproxy, on the router.
    pub proxy: Proxy,
    /// The router under llama-worker.
    pub server: LocalServer,
    /// The config `loopd serve` runs with (the bench renders its request body from it).
    pub config: Config,
    /// `loopd serve`'s socket.
    pub daemon_socket: PathBuf,
    dir: PathBuf,
}

impl Stack {
    /// Starts the three and returns once `loopd serve` is ready; panics naming the log to
    /// read when one cannot start.
    pub fn start() -> Stack {
        let server = LocalServer::start_with_configs("", "metrics = true\n");
        let proxy = Proxy::start(server.addr());
        let dir = temp_dir("e2e-bench");
        let (config_path, daemon_socket) = write_config(&dir, &server, &proxy);
        let config =
            Config::load(&config_path).unwrap_or_else(|e| panic!("{}: {e}", config_path.display()));
        let daemon = Daemon::start(&config_path, &dir);
        Stack {
            daemon,
            proxy,
            server,
            config,
            daemon_socket,
            dir,
        }
    }

    /// `loopd serve`'s pid.
    pub fn daemon_pid(&self) -> u32 {
        self.daemon.0.id()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.daemon.stop();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Writes `dir/loopd.toml`: greedy with the self-test's seed, the worker's status socket, the
/// daemon's socket `dir/loopd.sock`, its store `dir/loopd.db` (not the user's default store,
/// which another daemon may hold) and the `[expect]` the server reports (as
/// crates/loopd/tests/real_serve writes it). Returns the config's path and the daemon's socket.
fn write_config(dir: &Path, server: &LocalServer, proxy: &Proxy) -> (PathBuf, PathBuf) {
    let props = Client::new(ClientConfig::new(proxy.socket(), server.model()))
        .props()
        .expect("GET /props through inferproxy");
    let socket = dir.join("loopd.sock");
    let config = dir.join("loopd.toml");
    let seed = SAMPLING.seed.expect("the self-test pins a seed");
    let text = format!(
        "socket = {:?}\nmodel = {:?}\n\
         [sampling]\ntemperature = 0.0\nseed = {seed}\n\
         [runner]\nworker_socket = {:?}\n\
         [daemon]\nsocket = {:?}\nstore = {:?}\n\
         [expect]\nchat_template_sha256 = \"{}\"\nn_ctx = {}\ntotal_slots = {}\n",
        proxy.socket().display().to_string(),
        server.model(),
        server.status_socket().display().to_string(),
        socket.display().to_string(),
        dir.join("loopd.db").display().to_string(),
        llama_proto::hash::sha256(props.chat_template.as_bytes()).expect("hash the template"),
        props.n_ctx,
        props.total_slots,
    );
    std::fs::write(&config, text).expect("write loopd.toml");
    (config, socket)
}

/// The `loopd` binary: `$LOOPD_BIN`, or the workspace's debug build.
fn loopd_bin() -> PathBuf {
    std::env::var_os("LOOPD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_artifact("loopd", "bin", "loopd"))
}

struct Daemon(Child);

impl Daemon {
    fn start(config: &Path, dir: &Path) -> Daemon {
        let notify_path = dir.join("notify.sock");
        let log = dir.join("serve.log");
        let notify = UnixDatagram::bind(&notify_path).expect("bind the notify socket");
        let child = Command::new(loopd_bin())
            .args(["serve", "--config"])
            .arg(config)
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create serve.log"))
            .spawn()
            .expect("spawn loopd serve");
        let mut daemon = Daemon(child);
        notify
            .set_read_timeout(Some(READY_TIMEOUT))
            .expect("set a timeout");
        let mut buf = [0u8; 256];
        let ready = notify
            .recv(&mut buf)
            .map(|n| String::from_utf8_lossy(&buf[..n]).trim_end().to_owned());
        if !matches!(ready.as_deref(), Ok("READY=1")) {
            daemon.stop();
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("loopd serve never said READY=1 ({ready:?}); it said:\n{said}");
        }
        daemon
    }

    /// SIGTERM (the daemon stops within one poll interval), SIGKILL after [`STOP_GRACE`].
    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + STOP_GRACE;
        while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
