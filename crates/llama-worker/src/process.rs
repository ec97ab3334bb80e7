//! The server process: spawned into a process group headed by a guard, killed as a group,
//! reaped without ever blocking.
//!
//! The group is what makes "no process remains" true: the router's model instances and any
//! helper a script forks stay in the group the worker created, so one `kill(-pgid)` reaches
//! them all and `/proc` tells when they are gone.
//!
//! The guard is what makes it true when the worker itself is SIGKILLed. It is a tiny `sh`,
//! spawned first as the leader of a new group, whose stdin is a pipe only the worker holds
//! (`O_CLOEXEC`, so no server inherits it). The server is then spawned into the guard's group.
//! However the worker ends, the kernel closes its end of the pipe; the guard's `read` returns
//! and it runs `kill -KILL 0`, which reaches every process of the group at once, whatever the
//! server command is (a wrapper script that does not `exec`, a server whose children outlive
//! it). `PR_SET_PDEATHSIG` alone reaches only the worker's direct child; it stays on the server
//! for a server that moves itself out of the group. A process deeper down that starts its own
//! session or group escapes both; under systemd `KillMode=control-group` still catches it.
//!
//! The worker is also a child subreaper: a member whose parent exits first (a model instance
//! whose router was killed, or did not wait for it) becomes the worker's child, not init's, and
//! the kill reaps it before it calls the group gone. Otherwise such a zombie waits for init,
//! and systemd, finding it in the unit's cgroup when the worker has exited, logs that it had to
//! kill what the worker left.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::config::CommandSpec;
use crate::cpu;

/// The guard's shell.
pub const GUARD_SHELL: &str = "/bin/sh";

/// The guard's script: wait for the worker's end of stdin to close, then kill the whole group.
/// The worker never writes to it.
pub const GUARD_SCRIPT: &str = "read -r line; kill -KILL 0";

/// How often a kill checks whether the group is gone.
const KILL_POLL: Duration = Duration::from_millis(20);

/// After SIGKILL, how long to wait for the group to leave `/proc` and the children to be
/// reaped. Bounded so that a process in uninterruptible sleep (SIGKILL pending until its IO
/// returns) cannot hang the worker; what is not reaped by then is reaped later ([`Lingering`]).
pub const AFTER_SIGKILL: Duration = Duration::from_millis(800);

/// Sends `sig` to every process of group `pgid`. `ESRCH` (no such group) is success: the
/// group is already gone, which is what the caller wants.
pub fn signal_group(pgid: i32, sig: i32) -> io::Result<()> {
    if pgid <= 1 {
        // kill(0 or -1) would hit our own group or every process we may signal.
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    send(-pgid, sig)
}

/// kill(2) of `target` (a pid, or a negated pgid), `ESRCH` counted as success.
fn send(target: i32, sig: i32) -> io::Result<()> {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; callers pass a pid or
    // a negated pgid of a process group above 1, never 0 or -1.
    let rc = unsafe { libc::kill(target, sig) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(e)
    }
}

/// Makes this process the child subreaper of its descendants (Linux 3.4): an orphan below it
/// is reparented to it. Idempotent.
fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl(2) with PR_SET_CHILD_SUBREAPER takes plain integers and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reaps `pid` if it is an exited child of ours, without blocking; true when it was reaped.
fn reap_pid(pid: i32) -> bool {
    let mut status = 0;
    // SAFETY: waitpid(2) writes only into `status`, a live local; WNOHANG never blocks.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == pid }
}

/// How a [`run_briefly`] went.
#[derive(Debug)]
pub struct Ran {
    /// The exit status; `None` when it did not exit within the timeout and was killed.
    pub status: Option<ExitStatus>,
    /// The first bytes of what it wrote on stderr (lossy UTF-8).
    pub stderr: String,
}

/// Runs `program args` (stdin from /dev/null, stdout discarded, `env` added) and waits at most
/// `timeout` for it, killing it then. Of its stderr the first `kept` bytes are kept and the
/// rest drained, on a thread of its own so a chatty child never blocks on a full pipe.
pub fn run_briefly<K: AsRef<std::ffi::OsStr>, V: AsRef<std::ffi::OsStr>>(
    program: &str,
    args: &[&str],
    env: impl IntoIterator<Item = (K, V)>,
    timeout: Duration,
    kept: u64,
) -> io::Result<Ran> {
    use std::io::Read;
    let mut child = Command::new(program)
        .args(args)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut err = child.stderr.take().expect("stderr is piped");
    let reader = thread::spawn(move || {
        let mut text = Vec::new();
        let _ = err.by_ref().take(kept).read_to_end(&mut text);
        io::copy(&mut err, &mut io::sink()).ok();
        String::from_utf8_lossy(&text).into_owned()
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(KILL_POLL / 2),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    // The pipe ends when the child (or the kill) closed it.
    let stderr = reader.join().unwrap_or_default();
    Ok(Ran { status, stderr })
}

/// How a group kill went.
#[derive(Debug)]
pub struct KillReport {
    /// The server's exit status, if it was reaped.
    pub status: Option<ExitStatus>,
    /// Whether SIGTERM was not enough (or skipped) and SIGKILL was sent.
    pub escalated: bool,
    /// Live (non-zombie) group members still present at the end (0 in every sane case).
    pub survivors: usize,
    /// Children not reaped within [`AFTER_SIGKILL`]; reap them later with [`Lingering::try_reap`].
    pub lingering: Option<Lingering>,
}

/// Children that were killed but had not exited yet (e.g. in uninterruptible sleep).
#[derive(Debug)]
pub struct Lingering {
    children: Vec<Child>,
}

impl Lingering {
    /// Reaps whatever has exited, without blocking; true when nothing is left.
    pub fn try_reap(&mut self) -> bool {
        self.children
            .retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_)) | Err(_)));
        self.children.is_empty()
    }

    /// The pids still waited for.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }
}

/// Why a running server counts as gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The server exited with this status.
    Server(ExitStatus),
    /// The guard is gone (someone killed it): the group is no longer protected against the
    /// worker's death, so the worker treats the server as lost.
    GuardGone,
}

/// One spawned server, in the process group its guard leads.
#[derive(Debug)]
pub struct ServerProcess {
    server: Child,
    guard: Child,
    /// Dropping it makes the guard kill the group.
    guard_pipe: Option<ChildStdin>,
    pgid: i32,
    server_status: Option<ExitStatus>,
    guard_status: Option<ExitStatus>,
}

impl ServerProcess {
    /// Spawns the guard as the leader of a new process group, then `spec` into that group,
    /// stdin from /dev/null, with `PR_SET_PDEATHSIG = SIGKILL` (Linux: fires when the spawning
    /// *thread* exits, so spawn from the thread that drives the worker for its whole life, as
    /// [`crate::Worker`] does).
    pub fn spawn(spec: &CommandSpec) -> io::Result<Self> {
        become_subreaper()?;
        let log = match &spec.log_file {
            Some(path) => {
                let f = OpenOptions::new().create(true).append(true).open(path)?;
                Some((f.try_clone()?, f))
            }
            None => None,
        };
        let mut guard = Command::new(GUARD_SHELL)
            .args(["-c", GUARD_SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let guard_pipe = guard.stdin.take();
        let pgid = i32::try_from(guard.id()).map_err(|_| io::ErrorKind::InvalidData)?;
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .process_group(pgid);
        // SAFETY: the closure runs between fork and exec and calls only prctl(2) and
        // getppid(2), both async-signal-safe; it allocates nothing and touches no locks.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The worker died before prctl took effect: do not run an orphan.
                if libc::getppid() == 1 {
                    return Err(io::Error::from(io::ErrorKind::NotFound));
                }
                Ok(())
            });
        }
        if let Some((out, err)) = log {
            cmd.stdout(out).stderr(err);
        }
        match cmd.spawn() {
            Ok(server) => Ok(Self {
                server,
                guard,
                guard_pipe,
                pgid,
                server_status: None,
                guard_status: None,
            }),
            Err(e) => {
                // Closing the pipe makes the guard kill its group, which is only itself.
                drop(guard_pipe);
                let _ = signal_group(pgid, libc::SIGKILL);
                let deadline = Instant::now() + AFTER_SIGKILL;
                while !matches!(guard.try_wait(), Ok(Some(_)) | Err(_)) && Instant::now() < deadline
                {
                    thread::sleep(KILL_POLL);
                }
                Err(e)
            }
        }
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.server.id()
    }

    /// The process group id (the guard's pid).
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    fn reap(&mut self) {
        if self.server_status.is_none() {
            self.server_status = self.server.try_wait().ok().flatten();
        }
        if self.guard_status.is_none() {
            self.guard_status = self.guard.try_wait().ok().flatten();
        }
    }

    /// Whether the server or the guard is gone (reaping what has exited), never blocking.
    pub fn try_exited(&mut self) -> Option<Exit> {
        self.reap();
        match (self.server_status, self.guard_status) {
            (Some(s), _) => Some(Exit::Server(s)),
            (None, Some(_)) => Some(Exit::GuardGone),
            (None, None) => None,
        }
    }

    /// Whether nothing of the group is left, not even a zombie: the server and the guard are
    /// reaped, and so is every member the worker adopted as their subreaper.
    fn gone(&mut self, proc_root: &Path) -> bool {
        self.reap();
        let Ok(members) = cpu::group_members(proc_root, self.pgid) else {
            return false;
        };
        let own = [self.server.id(), self.guard.id()].map(|p| i32::try_from(p).unwrap_or(-1));
        let mut left = false;
        for m in members {
            // The server and the guard are reaped through their `Child`, which keeps their
            // status; another member that is not our child (its parent is a live member, or
            // init) answers ECHILD and stays.
            left |= own.contains(&m.pid) || !(m.is_zombie() && reap_pid(m.pid));
        }
        self.server_status.is_some() && self.guard_status.is_some() && !left
    }

    fn signal_all(&self, sig: i32) {
        let _ = signal_group(self.pgid, sig);
        // A server that moved itself out of the group; its pid cannot have been reused while
        // it is our unreaped child.
        if self.server_status.is_none() {
            if let Ok(pid) = i32::try_from(self.server.id()) {
                let _ = send(pid, sig);
            }
        }
    }

    /// SIGTERM to the group, up to `grace` for every member to go, SIGKILL to the group if any
    /// remain (at once when `skip_grace` is or becomes true), then at most [`AFTER_SIGKILL`]
    /// for the group to leave `/proc` and both children to be reaped. Never blocks longer:
    /// what is left is in the report. Members that outlive their parent are reparented and
    /// reaped by init, so "gone" means no live member in `/proc`.
    pub fn kill_group(mut self, grace: Duration, skip_grace: &AtomicBool) -> KillReport {
        let proc_root = Path::new("/proc");
        let deadline = Instant::now() + grace;
        let mut escalated = false;
        if !skip_grace.load(Ordering::SeqCst) {
            self.signal_all(libc::SIGTERM);
        }
        while !self.gone(proc_root) {
            if Instant::now() >= deadline || skip_grace.load(Ordering::SeqCst) {
                escalated = true;
                self.signal_all(libc::SIGKILL);
                break;
            }
            thread::sleep(KILL_POLL);
        }
        let deadline = Instant::now() + AFTER_SIGKILL;
        while !self.gone(proc_root) && Instant::now() < deadline {
            thread::sleep(KILL_POLL);
        }
        let survivors = cpu::live_members(proc_root, self.pgid).map_or(0, |m| m.len());
        // If the guard is somehow still there, closing its pipe makes it kill the group again.
        drop(self.guard_pipe.take());
        let mut children = Vec::new();
        if self.server_status.is_none() {
            children.push(self.server);
        }
        if self.guard_status.is_none() {
            children.push(self.guard);
        }
        KillReport {
            status: self.server_status,
            escalated,
            survivors,
            lingering: (!children.is_empty()).then_some(Lingering { children }),
        }
    }
}
