//! Test support for every crate of the workspace: a real local `llama-server` router and an
//! `inferproxy` in front of it, and the small helpers more than one crate's tests need (the
//! recorded fixtures, temp dirs, a free port, heap arrays, a counting allocator).
//!
//! Every test that talks to the real server gets it through [`LocalServer::start`], which runs
//! `scripts/serve.sh` (the same command line as `make serve`: the router under `llama-worker`)
//! on a free port and waits until the model is loaded. Processes are stopped when the handle drops, also when a test panics; if the
//! test process dies without unwinding, a watchdog in the server's process group sees its stdin
//! close and stops the group.
//!
//! The server and model come from the cache that `scripts/llama-server.sh` fills; `make test`
//! fills it before any test runs, and the script is a no-op once it is full.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a model load may take before `start` gives up (a cold CPU load takes seconds).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a stopped process group gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long the watchdog may take to signal its group and exit once its stdin closes.
const WATCHDOG_EXIT: Duration = Duration::from_secs(1);

mod alloc;
pub mod fake;
pub mod fake_worker;

pub use alloc::{allocations, counted, CountingAlloc};

/// The model id the preset in `scripts/serve.sh` defines.
pub const MODEL_ID: &str = "smollm2";

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crate lives in crates/<name>")
        .to_path_buf()
}

/// The path of `fixtures/<name>` (recorded from the real server; see fixtures/README.md).
pub fn fixture_path(name: &str) -> PathBuf {
    workspace_root().join("fixtures").join(name)
}

/// The bytes of `fixtures/<name>`; panics naming the path when it cannot be read.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = fixture_path(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `N` zero bytes on the heap as a fixed-size array, made without building it on the stack
/// (the storage a parser with an `N`-byte cap takes).
pub fn boxed_array<const N: usize>() -> Box<[u8; N]> {
    vec![0u8; N]
        .into_boxed_slice()
        .try_into()
        .expect("the vec has exactly N bytes")
}

/// A fresh, empty directory under the system temp dir, unique to this process and call.
///
/// The first call in a process also removes the directories of test processes that are gone
/// and that nobody has touched for [`STALE_TEMP_DIR`] (see [`remove_stale_temp_dirs`]).
pub fn temp_dir(tag: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        remove_stale_temp_dirs(&std::env::temp_dir(), STALE_TEMP_DIR);
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("boxmaker-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// How long the temp dir of a finished test process is kept: long enough to read the logs a
/// failed test's message points to.
pub const STALE_TEMP_DIR: Duration = Duration::from_secs(3600);

/// Removes every `boxmaker-<tag>-<pid>-<n>` directory in `root` whose process no longer exists
/// and which was last modified more than `older_than` ago; returns how many it removed.
///
/// A test process cannot always clean up after itself: a server shared through a `static` is
/// never dropped, and a killed or aborted test runs no destructor. Its watchdog stops its
/// processes; this removes what they leave on disk, on a later run.
pub fn remove_stale_temp_dirs(root: &Path, older_than: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(temp_dir_pid) else {
            continue;
        };
        let alive = Path::new("/proc").join(pid.to_string()).exists();
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > older_than);
        if !alive && old && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The pid in a name made by [`temp_dir`]: `boxmaker-<tag>-<pid>-<n>`.
fn temp_dir_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("boxmaker-")?;
    let mut parts = rest.rsplitn(3, '-');
    let n = parts.next()?;
    let pid = parts.next()?;
    let tag = parts.next()?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(n) && !tag.is_empty()).then_some(())?;
    pid.parse().ok().filter(|_| digits(pid))
}

/// Polls `probe` every 100 ms until it says `Ok`, for at most `timeout`, and returns its value.
///
/// A test against a real process waits for the condition it needs this way instead of
/// asserting a state at one instant. On timeout it panics naming `what` and the last thing
/// the probe saw.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match probe() {
            Ok(v) => return v,
            Err(seen) if Instant::now() >= deadline => {
                panic!("waited {timeout:?} for {what}; last saw: {seen}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The pids whose parent is `parent`, from `/proc/*/stat` (the model instances of a router).
pub fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid ...`: the comm may hold spaces, so split after its `)`.
        let rest = &stat[stat.rfind(')')? + 1..];
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == parent).then_some(pid)
    })
    .collect()
}

/// `root` and every process below it (by parent pid, at this moment).
pub fn process_tree(root: u32) -> Vec<u32> {
    let mut all = vec![root];
    let mut i = 0;
    while i < all.len() {
        let kids = children_of(all[i]);
        all.extend(kids);
        i += 1;
    }
    all
}

/// Pins `root` and every process below it, each of its threads, to CPU `cpu` (`taskset -a
/// -c -p`); children started later inherit it. Returns the pids pinned; panics when taskset
/// fails on the root.
pub fn pin_to_cpu(root: u32, cpu: usize) -> Vec<u32> {
    let pids = process_tree(root);
    for &pid in &pids {
        let ok = Command::new("taskset")
            .args(["-a", "-c", "-p", &cpu.to_string(), &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(
            ok || pid != root,
            "taskset could not pin {pid} to CPU {cpu}"
        );
    }
    pids
}

/// A `socat` forwarding a Unix socket to another (each connection to its own child), in a
/// process group of its own with the harness's watchdog: the stand-in for an SSH tunnel's
/// `-L LOCAL.sock:REMOTE.sock`, which a test kills (a partition: the socket file stays and
/// refuses, every forwarded connection ends) or stops (a black hole: nothing moves, nothing
/// ends). Needs socat (`make socat`).
pub struct Forwarder {
    group: Option<Group>,
    listen: PathBuf,
    target: PathBuf,
    log: PathBuf,
}

impl Forwarder {
    /// Starts `socat UNIX-LISTEN:listen,fork,unlink-early UNIX-CONNECT:target` and waits
    /// until `listen` accepts (10 s).
    pub fn start(listen: &Path, target: &Path) -> Forwarder {
        let log = listen.with_extension("socat.log");
        let mut f = Forwarder {
            group: None,
            listen: listen.to_owned(),
            target: target.to_owned(),
            log,
        };
        f.restart();
        f
    }

    /// The socket it listens on.
    pub fn socket(&self) -> &Path {
        &self.listen
    }

    /// SIGKILL to the whole group: the listener and every forwarded connection end at once.
    pub fn kill(&mut self) {
        if let Some(mut g) = self.group.take() {
            g.signal("-KILL");
            let _ = g.child.wait();
        }
    }

    /// SIGSTOP to the whole group: connections stay open and carry nothing.
    pub fn pause(&self) {
        if let Some(g) = &self.group {
            g.signal("-STOP");
        }
    }

    /// SIGCONT to the whole group.
    pub fn resume(&self) {
        if let Some(g) = &self.group {
            g.signal("-CONT");
        }
    }

    /// Starts it again on the same path (killing a running one first).
    pub fn restart(&mut self) {
        self.kill();
        let args = vec![
            format!("UNIX-LISTEN:{},fork,unlink-early", self.listen.display()),
            format!("UNIX-CONNECT:{}", self.target.display()),
        ];
        let group = Group::spawn(Path::new("socat"), &args, &[], &self.log);
        wait_for(
            &format!("socat to listen on {}", self.listen.display()),
            Duration::from_secs(10),
            || match std::os::unix::net::UnixStream::connect(&self.listen) {
                Ok(_) => Ok(()),
                Err(e) => Err(e.to_string()),
            },
        );
        self.group = Some(group);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Some(g) = &self.group {
            g.signal("-CONT");
        }
        if let Some(mut g) = self.group.take() {
            g.stop();
        }
        let _ = std::fs::remove_file(&self.listen);
    }
}

/// A process group started with a watchdog that ends it when this process goes away.
struct Group {
    child: Child,
}

impl Group {
    /// Runs `program args` in a new process group headed by a small shell that waits for its stdin
    /// (a pipe from this process) to close and then sends SIGTERM to the whole group.
    fn spawn(program: &Path, args: &[String], envs: &[(&str, &Path)], log: &Path) -> Group {
        let log = std::fs::File::create(log).expect("create log file");
        let child = Command::new("bash")
            .envs(envs.iter().copied())
            .arg("-c")
            .arg(r#""$@" </dev/null & cat >/dev/null; kill -TERM 0"#)
            .arg("watchdog")
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        Group { child }
    }

    fn pgid(&self) -> u32 {
        self.child.id()
    }

    fn alive(&self) -> bool {
        // `kill -0 -PGID` succeeds while any process of the group exists.
        Command::new("kill")
            .args(["-0", "--", &format!("-{}", self.pgid())])
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, "--", &format!("-{}", self.pgid())])
            .stderr(Stdio::null())
            .status();
    }

    /// SIGTERM to the group, once, then SIGKILL if anything is left after the grace period.
    ///
    /// Closing the watchdog's stdin makes it send the SIGTERM; only a watchdog that is already
    /// gone leaves it to us. A second SIGTERM would tell llama-worker to kill its server at once
    /// instead of stopping it.
    fn stop(&mut self) {
        drop(self.child.stdin.take());
        let handed_over = Instant::now() + WATCHDOG_EXIT;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < handed_over {
            std::thread::sleep(Duration::from_millis(10));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal("-TERM");
        }
        let deadline = Instant::now() + STOP_GRACE;
        while self.alive() && Instant::now() < deadline {
            let _ = self.child.try_wait();
            std::thread::sleep(Duration::from_millis(50));
        }
        if self.alive() {
            self.signal("-KILL");
        }
        let _ = self.child.wait();
    }
}

/// A local llama-server router serving [`MODEL_ID`] on 127.0.0.1.
pub struct LocalServer {
    group: Group,
    dir: PathBuf,
    addr: SocketAddr,
    log: PathBuf,
    status_socket: PathBuf,
}

impl LocalServer {
    /// Starts the router on a free port and waits until the model is loaded and `llama-worker`
    /// says the server is ready (its own probe can lag the router's first answer).
    ///
    /// Panics with the server's log path when it cannot start: this is test support.
    pub fn start() -> LocalServer {
        let server = Self::spawn(&[]);
        server.wait_loaded();
        server.wait_worker("llama-worker to report ready", READY_TIMEOUT, |s| {
            s["state"] == "ready"
        });
        server
    }

    /// Starts the router serving `model_file` under [`MODEL_ID`] (`MODEL_FILE` of
    /// `scripts/serve.sh`), and returns at once: for the tests of a model that cannot load,
    /// which wait on the worker's status themselves.
    pub fn start_serving(model_file: &Path) -> LocalServer {
        Self::spawn(&[("MODEL_FILE", model_file)])
    }

    /// As [`start`](Self::start), with `lines` appended to llama-worker's config (TOML keys
    /// of docs/llama-worker.md): for the tests that scale the worker's timers down.
    pub fn start_with_worker_config(lines: &str) -> LocalServer {
        Self::start_with_configs(lines, "")
    }

    /// As [`start_with_worker_config`](Self::start_with_worker_config), with `preset` lines
    /// appended to the model's preset section too (llama-server flags without their dashes,
    /// `b = 4096`; `PRESET_EXTRA` of `scripts/serve.sh`).
    pub fn start_with_configs(worker: &str, preset: &str) -> LocalServer {
        let dir = temp_dir("worker-extra");
        let extra = dir.join("extra.toml");
        std::fs::write(&extra, worker).expect("write the worker's extra config");
        let preset_extra = dir.join("preset.ini");
        std::fs::write(&preset_extra, preset).expect("write the preset's extra lines");
        let server = Self::spawn(&[
            ("WORKER_CONFIG_EXTRA", &extra),
            ("PRESET_EXTRA", &preset_extra),
        ]);
        server.wait_loaded();
        server.wait_worker("llama-worker to report ready", READY_TIMEOUT, |s| {
            s["state"] == "ready"
        });
        server
    }

    fn spawn(envs: &[(&str, &Path)]) -> LocalServer {
        let dir = temp_dir("llama");
        let port = free_port();
        let log = dir.join("server.log");
        let serve = workspace_root().join("scripts/serve.sh");
        let status_socket = dir.join("worker.sock");
        let args = [
            "--port".to_string(),
            port.to_string(),
            "--status-socket".to_string(),
            status_socket.display().to_string(),
        ];
        let group = Group::spawn(&serve, &args, envs, &log);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        LocalServer {
            group,
            dir,
            addr,
            log,
            status_socket,
        }
    }

    /// The router's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The model id to put in requests.
    pub fn model(&self) -> &str {
        MODEL_ID
    }

    /// The file the server's stdout and stderr go to.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The process group id of the harness's watchdog, `llama-worker` and its helpers. The
    /// `llama-server` router runs in a group of its own, which the worker owns.
    pub fn pgid(&self) -> u32 {
        self.group.pgid()
    }

    /// `llama-worker`'s status socket (what loopd's `runner.worker_socket` names).
    pub fn status_socket(&self) -> &Path {
        &self.status_socket
    }

    /// What `llama-worker` says of the server, as its status JSON.
    pub fn worker_status(&self) -> std::io::Result<serde_json::Value> {
        use std::io::BufRead;
        let mut s = std::os::unix::net::UnixStream::connect(&self.status_socket)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"status\n")?;
        let mut line = String::new();
        std::io::BufReader::new(s).read_line(&mut line)?;
        serde_json::from_str(&line)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    /// Waits up to `timeout` for the worker's status to satisfy `pred`, and returns it; panics
    /// with the last status seen (or why none could be read).
    pub fn wait_worker(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_for(what, timeout, || match self.worker_status() {
            Ok(s) if pred(&s) => Ok(s),
            Ok(s) => Err(s.to_string()),
            Err(e) => Err(format!("no status: {e}")),
        })
    }

    /// The pid of the `llama-server` router the worker runs now.
    pub fn server_pid(&self) -> Option<u32> {
        let status = self.worker_status().ok()?;
        status.get("pid")?.as_u64().map(|p| p as u32)
    }

    fn wait_loaded(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let path = format!("/props?model={MODEL_ID}");
        loop {
            if let Ok((200, _)) = http_get(self.addr, &path) {
                return;
            }
            if !self.group.alive() || Instant::now() > deadline {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: String = log.lines().rev().take(30).collect::<Vec<_>>().join("\n");
                panic!("llama-server did not load {MODEL_ID} on {}; log (last lines, newest first):\n{tail}", self.addr);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for LocalServer {
    /// Stops the server and removes its directory, unless a test is failing: then the log the
    /// failure points to stays (until [`remove_stale_temp_dirs`] finds it on a later run).
    fn drop(&mut self) {
        self.group.stop();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// CPU-bound processes beside a test, as a busy box has them (other builds on the
/// same cores): each is a shell loop (`while :; do :; done`) in a process group of its own
/// under the same watchdog as the server, so a test that dies without unwinding leaves none
/// spinning. Dropping it stops them (SIGTERM to each group, by its id).
pub struct CpuLoad {
    groups: Vec<Group>,
    dir: PathBuf,
}

impl CpuLoad {
    /// Starts `n` loops (none for 0).
    pub fn start(n: usize) -> CpuLoad {
        let dir = temp_dir("cpu-load");
        let args = ["-c".to_owned(), "while :; do :; done".to_owned()];
        let groups = (0..n)
            .map(|i| Group::spawn(Path::new("sh"), &args, &[], &dir.join(format!("{i}.log"))))
            .collect();
        CpuLoad { groups, dir }
    }

    /// How many loops run.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The process groups of the loops (each headed by its watchdog).
    pub fn pgids(&self) -> Vec<u32> {
        self.groups.iter().map(Group::pgid).collect()
    }
}

impl Drop for CpuLoad {
    fn drop(&mut self) {
        for g in &mut self.groups {
            g.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The 1, 5 and 15 minute load averages from `/proc/loadavg`, as written there
/// (`"2.31 1.90 1.42"`), or what went wrong reading it.
pub fn load_average() -> String {
    match std::fs::read_to_string("/proc/loadavg") {
        Ok(t) => t.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        Err(e) => format!("no /proc/loadavg: {e}"),
    }
}

/// An `inferproxy` forwarding a Unix socket in a temp dir to a TCP upstream.
pub struct Proxy {
    group: Option<Group>,
    upstream: SocketAddr,
    socket: PathBuf,
    dir: PathBuf,
}

impl Proxy {
    /// Starts `inferproxy --listen <temp>/infer.sock --upstream <upstream>` and waits for the socket.
    pub fn start(upstream: SocketAddr) -> Proxy {
        let dir = temp_dir("proxy");
        let socket = dir.join("infer.sock");
        let mut proxy = Proxy {
            group: None,
            upstream,
            socket,
            dir,
        };
        proxy.restart();
        proxy
    }

    /// The socket path clients connect to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Kills the proxy with SIGKILL (leaving its stale socket file behind, as a crash would).
    pub fn kill(&mut self) {
        if let Some(mut g) = self.group.take() {
            g.signal("-KILL");
            let _ = g.child.wait();
        }
    }

    /// Starts the proxy again on the same socket path (killing a running one first).
    pub fn restart(&mut self) {
        self.kill();
        let args = vec![
            "--listen".to_string(),
            self.socket.display().to_string(),
            "--upstream".to_string(),
            self.upstream.to_string(),
        ];
        let group = Group::spawn(&inferproxy_bin(), &args, &[], &self.dir.join("proxy.log"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "inferproxy did not listen on {}",
                self.socket.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.group = Some(group);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(mut g) = self.group.take() {
            g.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `inferproxy` binary: `$INFERPROXY_BIN`, or the workspace's, built on first use.
pub fn inferproxy_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("INFERPROXY_BIN") {
        return PathBuf::from(p);
    }
    workspace_artifact("inferproxy", "bin", "inferproxy")
}

/// Builds one target of a workspace package (`kind` is `bin` or `example`) with the cargo that
/// runs the tests, and returns the executable's path as cargo reports it.
///
/// Cargo's own `executable` field is used rather than a guessed path under `target/`: it follows
/// `CARGO_TARGET_DIR`, the profile, and examples that `cargo test` builds only as test harnesses.
pub fn workspace_artifact(package: &str, kind: &str, name: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "-q", "--message-format=json", "-p", package])
        .arg(format!("--{kind}"))
        .arg(name)
        .current_dir(workspace_root())
        .stderr(Stdio::inherit())
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build -p {package} --{kind} {name} failed"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == kind))
        })
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo reported no executable for {kind} {name}"))
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// One `GET` with `Connection: close`; returns the status and the raw body (not de-chunked).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    http_request(addr, "GET", path, None)
}

/// One request with an optional JSON body and `Connection: close`; returns the status and the
/// raw body bytes after the head (chunked bodies are returned still chunked).
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    json: Option<&[u8]>,
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(body) = json {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    if let Some(body) = json {
        s.write_all(body)?;
    }
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(&raw) {
        Ok(httparse::Status::Complete(n)) => Ok((resp.code.unwrap_or(0), raw[n..].to_vec())),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "bad HTTP response head",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The group's process records each SIGTERM as it arrives and, like llama-worker, takes a
    /// while to stop after the first: a second one in that time is recorded too.
    #[test]
    fn stop_sends_one_sigterm() {
        let dir = temp_dir("group-stop");
        let record = dir.join("signals");
        let ready = dir.join("ready");
        let script = r#"
import os, signal, sys, time
record, ready = sys.argv[1], sys.argv[2]
terms = []
signal.signal(signal.SIGTERM, lambda *_: terms.append(time.monotonic()) or open(record, "a").write("TERM\n"))
open(ready, "w").close()
while not terms:
    time.sleep(0.01)
end = terms[0] + 1.0
while time.monotonic() < end:
    time.sleep(0.01)
"#;
        let args = [
            "-c".to_string(),
            script.to_string(),
            record.display().to_string(),
            ready.display().to_string(),
        ];
        let mut group = Group::spawn(Path::new("python3"), &args, &[], &dir.join("log"));
        wait_for("the handler to be set", Duration::from_secs(10), || {
            ready
                .exists()
                .then_some(())
                .ok_or_else(|| "not yet".to_string())
        });
        group.stop();
        assert!(!group.alive());
        assert_eq!(std::fs::read_to_string(&record).unwrap(), "TERM\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
