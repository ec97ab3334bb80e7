//! The process side of the RPC unit: starts the local `ggml-rpc-server`s (each in a process
//! group of its own led by a guard, as the server's), notices when one exits, kills them, and
//! probes every endpoint with a connect. The worker ([`crate::worker`]) drives it from the
//! policy's actions; nothing here decides anything.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::policy::Endpoints;
use crate::process::{Exit, Lingering, ServerProcess};
use crate::rpc::{connect, EndpointStatus, Place, RpcConfig, LOCAL_HOST};

/// The unit's RPC servers: the local ones it runs, the remote ones it checks.
#[derive(Debug)]
pub struct RpcUnit {
    config: RpcConfig,
    log_file: Option<PathBuf>,
    /// Local entries first (their current port), then the remote ones, in config order.
    endpoints: Vec<EndpointStatus>,
    /// The running local servers, by `[[rpc.local]]` index.
    locals: Vec<Option<ServerProcess>>,
}

/// A local RPC server that exited on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpcExit {
    /// Which one.
    pub endpoint: EndpointStatus,
    /// How (`signal: 9 (SIGKILL)`, `its group's guard was killed`, …).
    pub what: String,
}

impl RpcUnit {
    /// The unit for `config` (validated with the server's port:
    /// [`crate::Config::validate_for_port`]).
    pub fn new(config: RpcConfig, log_file: Option<PathBuf>) -> Self {
        let mut endpoints: Vec<EndpointStatus> = config
            .local
            .iter()
            .enumerate()
            .map(|(i, l)| EndpointStatus {
                addr: SocketAddr::new(LOCAL_HOST, l.port.unwrap_or(0)),
                place: Place::Local(i),
                pid: None,
                pgid: None,
                last_probe: None,
            })
            .collect();
        endpoints.extend(
            config
                .remote_addrs()
                .into_iter()
                .map(|addr| EndpointStatus {
                    addr,
                    place: Place::Remote,
                    pid: None,
                    pgid: None,
                    last_probe: None,
                }),
        );
        Self {
            locals: config.local.iter().map(|_| None).collect(),
            config,
            log_file,
            endpoints,
        }
    }

    /// Every endpoint with its latest probe.
    pub fn endpoints(&self) -> &[EndpointStatus] {
        &self.endpoints
    }

    /// Every endpoint's address, for `--rpc`.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.endpoints.iter().map(|e| e.addr).collect()
    }

    /// The process groups of the running local servers.
    pub fn pgids(&self) -> Vec<i32> {
        self.locals
            .iter()
            .flatten()
            .map(ServerProcess::pgid)
            .collect()
    }

    /// Starts every local server (a fixed port, or a free one chosen now). On an error the ones
    /// already started are killed (SIGKILL) and the error names the command.
    pub fn start(&mut self, skip_grace: &AtomicBool) -> Result<(), (String, io::Error)> {
        for e in &mut self.endpoints {
            e.last_probe = None;
        }
        for i in 0..self.locals.len() {
            let port = match self.config.local[i].port {
                Some(p) => p,
                None => match free_port() {
                    Ok(p) => p,
                    Err(e) => {
                        self.kill(Duration::ZERO, skip_grace);
                        return Err(("a free port for an RPC server".into(), e));
                    }
                },
            };
            let spec = self.config.local_spec(i, port, self.log_file.clone());
            match ServerProcess::spawn(&spec) {
                Ok(p) => {
                    let e = &mut self.endpoints[i];
                    e.addr = SocketAddr::new(LOCAL_HOST, port);
                    e.pid = Some(p.pid());
                    e.pgid = Some(p.pgid());
                    eprintln!(
                        "llama-worker: spawned RPC server {} as pid {} (group {})",
                        e,
                        p.pid(),
                        p.pgid()
                    );
                    self.locals[i] = Some(p);
                }
                Err(err) => {
                    self.kill(Duration::ZERO, skip_grace);
                    return Err((spec.program, err));
                }
            }
        }
        Ok(())
    }

    /// The first local server that exited (or whose guard is gone), never blocking.
    pub fn try_exited(&mut self) -> Option<RpcExit> {
        for (i, slot) in self.locals.iter_mut().enumerate() {
            let Some(p) = slot else { continue };
            let Some(exit) = p.try_exited() else { continue };
            let what = match exit {
                Exit::Server(status) => status.to_string(),
                Exit::GuardGone => "its group's guard was killed".to_string(),
            };
            return Some(RpcExit {
                endpoint: self.endpoints[i].clone(),
                what,
            });
        }
        None
    }

    /// Kills every local server's group (SIGTERM, `grace`, SIGKILL); returns the children not
    /// reaped yet.
    pub fn kill(&mut self, grace: Duration, skip_grace: &AtomicBool) -> Vec<Lingering> {
        let mut left = Vec::new();
        for (i, slot) in self.locals.iter_mut().enumerate() {
            let Some(p) = slot.take() else { continue };
            let pgid = p.pgid();
            let r = p.kill_group(grace, skip_grace);
            let e = &mut self.endpoints[i];
            eprintln!(
                "llama-worker: killed RPC server {e} (group {pgid}){} (survivors: {})",
                if r.escalated { " with SIGKILL" } else { "" },
                r.survivors
            );
            e.pid = None;
            e.pgid = None;
            left.extend(r.lingering);
        }
        left
    }

    /// Connects to every endpoint (or only the remote ones), each within `timeout`, and
    /// records the answers; the worst finding, or `None` when cancelled.
    pub fn probe(
        &mut self,
        remote_only: bool,
        timeout: Duration,
        cancelled: &dyn Fn() -> bool,
    ) -> Option<Endpoints> {
        let mut found = Endpoints::Up;
        for e in &mut self.endpoints {
            if remote_only && e.place != Place::Remote {
                continue;
            }
            let r = connect(e.addr, timeout, cancelled);
            if r == Err(crate::probe::ProbeError::Cancelled) {
                return None;
            }
            if r.is_err() {
                found = match (found, e.place) {
                    (_, Place::Local(_)) | (Endpoints::LocalDown, _) => Endpoints::LocalDown,
                    _ => Endpoints::RemoteDown,
                };
            }
            e.last_probe = Some(r);
        }
        Some(found)
    }

    /// The first endpoint whose latest probe failed.
    pub fn first_down(&self) -> Option<&EndpointStatus> {
        self.endpoints
            .iter()
            .find(|e| matches!(e.last_probe, Some(Err(_))))
    }
}

/// A port nothing listens on now (bound and released; the RPC server binds it next).
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((LOCAL_HOST, 0))?.local_addr()?.port())
}
