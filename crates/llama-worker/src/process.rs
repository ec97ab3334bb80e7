//! The server process: spawned in its own process group, killed as a group, reaped.
//!
//! The group is what makes "no process remains" true: the router's model instances and any
//! helper a script forks stay in the group the worker created, so one `kill(-pgid)` reaches
//! them all and `/proc` tells when they are gone.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::config::CommandSpec;
use crate::cpu;

/// How often a kill checks whether the group is gone.
const KILL_POLL: Duration = Duration::from_millis(20);

/// After SIGKILL, how long to wait for the group to leave `/proc` (the kernel needs a moment
/// to tear down a big process; not a policy number).
const AFTER_SIGKILL: Duration = Duration::from_secs(5);

/// Sends `sig` to every process of group `pgid`. `ESRCH` (no such group) is success: the
/// group is already gone, which is what the caller wants.
pub fn signal_group(pgid: i32, sig: i32) -> io::Result<()> {
    if pgid <= 1 {
        // kill(0 or -1) would hit our own group or every process we may signal.
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; a negative pid
    // addresses the process group, and pgid > 1 was checked so it is never 0 or -1.
    let rc = unsafe { libc::kill(-pgid, sig) };
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

/// How a group kill went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KillReport {
    /// The leader's exit status, if it was reaped.
    pub status: Option<ExitStatus>,
    /// Whether SIGTERM was not enough and SIGKILL was sent.
    pub escalated: bool,
    /// Live (non-zombie) group members still present at the end (0 in every sane case).
    pub survivors: usize,
}

/// One spawned server: the leader of its own process group.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    pgid: i32,
    reaped: Option<ExitStatus>,
}

impl ServerProcess {
    /// Spawns `spec` as the leader of a new process group, stdin from /dev/null, with
    /// `PR_SET_PDEATHSIG = SIGKILL` (Linux: fires when the spawning *thread* exits, so spawn
    /// from the thread that drives the worker for its whole life, as [`crate::Worker`] does).
    pub fn spawn(spec: &CommandSpec) -> io::Result<Self> {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .process_group(0);
        // If the worker is SIGKILLed it cannot stop its server; the kernel then kills the
        // leader (the router, whose model instances exit when it goes).
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
        if let Some(path) = &spec.log_file {
            let f = OpenOptions::new().create(true).append(true).open(path)?;
            cmd.stdout(f.try_clone()?).stderr(f);
        }
        let child = cmd.spawn()?;
        let pgid = i32::try_from(child.id()).map_err(|_| io::ErrorKind::InvalidData)?;
        Ok(Self {
            child,
            pgid,
            reaped: None,
        })
    }

    /// The leader's pid, which is also the group id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process group id.
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// Reaps the leader if it has exited; its status then.
    pub fn try_exited(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.reaped.is_none() {
            self.reaped = self.child.try_wait()?;
        }
        Ok(self.reaped)
    }

    /// SIGTERM to the group, up to `grace` for every member to go, SIGKILL to the group if
    /// any remain, reap the leader. Members that outlive their parent are reparented and
    /// reaped by init, so "gone" means no live member in `/proc`.
    pub fn kill_group(mut self, grace: Duration) -> KillReport {
        let proc_root = Path::new("/proc");
        let _ = signal_group(self.pgid, libc::SIGTERM);
        let gone = |p: &mut Self| {
            let _ = p.try_exited();
            p.reaped.is_some() && cpu::live_members(proc_root, p.pgid).is_ok_and(|m| m.is_empty())
        };
        let deadline = Instant::now() + grace;
        let mut escalated = false;
        while !gone(&mut self) {
            if Instant::now() >= deadline {
                escalated = true;
                let _ = signal_group(self.pgid, libc::SIGKILL);
                break;
            }
            thread::sleep(KILL_POLL);
        }
        if self.reaped.is_none() {
            self.reaped = self.child.wait().ok();
        }
        let deadline = Instant::now() + AFTER_SIGKILL;
        let survivors = loop {
            let live = cpu::live_members(proc_root, self.pgid).map_or(0, |m| m.len());
            if live == 0 || Instant::now() >= deadline {
                break live;
            }
            thread::sleep(KILL_POLL);
        };
        KillReport {
            status: self.reaped,
            escalated,
            survivors,
        }
    }
}
