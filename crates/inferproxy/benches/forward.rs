//! inferproxy against socat and a direct TCP connection, side by side in one run.
//!
//! `cargo bench -p inferproxy --bench forward` (or `make bench`, which installs socat when
//! missing; this binary needs it at /usr/bin/socat). Prints three Markdown tables:
//!
//! 1. bulk throughput upstream -> client, the forwarder's CPU time per GiB, and its memory with
//!    8 live connections;
//! 2. 230-byte ping-pong round trips (p50/p99 and what the forwarder adds over direct TCP),
//!    measured two ways: a new connection for each slice of round trips, as loopd opens one per
//!    request, and one connection held for the whole run;
//! 3. a paced one-way stream, the shape of a model's token events: the upstream writes a
//!    230-byte event every millisecond and the client reads it; latency from the write to the
//!    read.
//!
//! Why two ping-pongs: on a VM whose idle vCPUs halt, where each task of a connection sits
//! (on a busy vCPU or on one that must be woken) decides most of a round trip, and the
//! scheduler places a connection's tasks once and mostly leaves them there. One held connection
//! is one draw of that placement; a connection per slice is twenty.
//! (`docs/benchmarks/inferproxy.md` has the measurements behind this.)
//!
//! Environment: `INFERPROXY_BENCH_MIB` (default 1024) bulk size per run, three runs per peer,
//! interleaved, median reported; `INFERPROXY_BENCH_PINGS` (default 20000) measured round trips
//! per peer and per ping-pong; `INFERPROXY_BENCH_EVENTS` (default 200) events per stream
//! connection and `INFERPROXY_BENCH_GAP_US` (default 1000) the gap between them;
//! `INFERPROXY_BENCH_PIN=client,upstream,forwarder` (e.g. `0,1,1`) pins the bench's client
//! thread, the upstream's connection threads and the forwarders to those CPUs, to measure one
//! placement at a time.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const MESSAGE: usize = 230;
const BULK_RUNS: usize = 3;
const LIVE_CONNECTIONS: usize = 8;
/// Round trips before measuring, per held connection and per fresh one.
const WARM_UP_PINGS: usize = 1000;
const WARM_UP_PINGS_FRESH: usize = 100;
const PING_SLICES: usize = 20;
/// The paced stream: connections per peer, events per connection, and the gap between events.
const STREAM_SLICES: usize = 5;
const STREAM_EVENTS: usize = 200;
const STREAM_GAP_US: usize = 1000;
const SOCAT: &str = "/usr/bin/socat";

trait Duplex: Read + Write + Send {}
impl<T: Read + Write + Send> Duplex for T {}

/// The upstream: first byte `B` + u64 length = send that many bytes; `E` = echo until EOF.
/// Either way the connection stays open until the client ends it.
fn upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            thread::spawn(move || {
                if let Some(pin) = pinning() {
                    pin_this_thread(pin.upstream);
                }
                serve(stream)
            });
        }
    });
    addr
}

fn serve(mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    let mut cmd = [0u8; 1];
    if s.read_exact(&mut cmd).is_err() {
        return;
    }
    let mut buf = vec![0u8; 256 * 1024];
    match cmd[0] {
        b'B' => {
            let mut len = [0u8; 8];
            if s.read_exact(&mut len).is_err() {
                return;
            }
            let mut left = u64::from_be_bytes(len) as usize;
            buf.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
            while left > 0 {
                let n = left.min(buf.len());
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
                left -= n;
            }
            let _ = s.read_to_end(&mut Vec::new());
        }
        b'S' => {
            // A paced event stream: count u32, gap µs u32; each event carries its send time.
            let mut head = [0u8; 8];
            if s.read_exact(&mut head).is_err() {
                return;
            }
            let count = u32::from_be_bytes(head[..4].try_into().unwrap());
            let gap =
                Duration::from_micros(u32::from_be_bytes(head[4..].try_into().unwrap()).into());
            let mut event = [b'e'; MESSAGE];
            for _ in 0..count {
                thread::sleep(gap);
                event[..8].copy_from_slice(&since_epoch_ns().to_be_bytes());
                if s.write_all(&event).is_err() {
                    return;
                }
            }
            let _ = s.read_to_end(&mut Vec::new());
        }
        b'E' => loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if s.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            }
        },
        _ => {}
    }
}

/// Nanoseconds since the bench started, on the monotonic clock the client and upstream share.
fn since_epoch_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// One connection's paced stream: `count` events `gap_us` apart; appends each event's
/// upstream-write to client-read latency in microseconds.
fn stream(f: &Forwarder, count: u32, gap_us: u32, times: &mut Vec<f64>) {
    let mut c = f.connect();
    let mut req = vec![b'S'];
    req.extend_from_slice(&count.to_be_bytes());
    req.extend_from_slice(&gap_us.to_be_bytes());
    c.write_all(&req).unwrap();
    let mut event = [0u8; MESSAGE];
    for _ in 0..count {
        c.read_exact(&mut event).unwrap();
        let sent = u64::from_be_bytes(event[..8].try_into().unwrap());
        times.push(since_epoch_ns().saturating_sub(sent) as f64 / 1e3);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Peer {
    Direct,
    Socat,
    /// socat with a 64 KiB buffer, inferproxy's size: shows how much is buffer size alone.
    Socat64k,
    Inferproxy,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Direct => "direct TCP",
            Peer::Socat => "socat",
            Peer::Socat64k => "socat -b65536",
            Peer::Inferproxy => "inferproxy",
        }
    }
}

struct Forwarder {
    peer: Peer,
    child: Option<Child>,
    path: PathBuf,
    upstream: String,
}

/// CPUs to pin the bench's tasks to, from `INFERPROXY_BENCH_PIN=client,upstream,forwarder`
/// (for example `0,1,1`); unset, the scheduler places everything, as in production.
#[derive(Debug, Clone, Copy)]
struct Pinning {
    client: usize,
    upstream: usize,
    forwarder: usize,
}

fn pinning() -> Option<Pinning> {
    static PINNING: std::sync::OnceLock<Option<Pinning>> = std::sync::OnceLock::new();
    *PINNING.get_or_init(|| {
        let value = std::env::var("INFERPROXY_BENCH_PIN").ok()?;
        let cpus: Vec<usize> = value
            .split(',')
            .map(|c| c.trim().parse().ok())
            .collect::<Option<_>>()
            .filter(|v: &Vec<usize>| v.len() == 3)
            .unwrap_or_else(|| {
                panic!("INFERPROXY_BENCH_PIN={value}: want three CPU numbers: client,upstream,forwarder")
            });
        Some(Pinning {
            client: cpus[0],
            upstream: cpus[1],
            forwarder: cpus[2],
        })
    })
}

fn pin_this_thread(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)
        .unwrap_or_else(|e| panic!("INFERPROXY_BENCH_PIN: cannot pin to CPU {cpu}: {e}"));
}

/// Whether a Unix socket bound at `path` is listening: `/proc/net/unix` lists it with the
/// `__SO_ACCEPTCON` flag (00010000) once `listen()` was called.
fn listening(path: &Path) -> bool {
    let table = fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let want = path.to_string_lossy();
    table.lines().skip(1).any(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        cols.len() == 8 && cols[3] == "00010000" && cols[7] == want
    })
}

impl Forwarder {
    fn start(peer: Peer, dir: &Path, upstream: &str) -> Self {
        // A child inherits the affinity of the thread that starts it.
        if let Some(pin) = pinning() {
            pin_this_thread(pin.forwarder);
        }
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("{}-{n}.sock", peer.name().replace([' ', '-'], "")));
        let child = match peer {
            Peer::Direct => None,
            Peer::Socat | Peer::Socat64k => Some(
                Command::new(SOCAT)
                    .args(if peer == Peer::Socat64k {
                        &["-b65536"][..]
                    } else {
                        &[]
                    })
                    .arg(format!("UNIX-LISTEN:{},fork", path.display()))
                    .arg(format!("TCP:{upstream}"))
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("socat at /usr/bin/socat"),
            ),
            Peer::Inferproxy => Some(
                Command::new(env!("CARGO_BIN_EXE_inferproxy"))
                    .args(["--listen".as_ref(), path.as_os_str()])
                    .args(["--upstream", upstream])
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            ),
        };
        if let Some(pin) = pinning() {
            pin_this_thread(pin.client);
        }
        let f = Self {
            peer,
            child,
            path,
            upstream: upstream.to_owned(),
        };
        if peer != Peer::Direct {
            // socat's socket file appears at bind(), before listen(), and a connection in
            // between is refused: wait for the kernel's listening flag on that path.
            // inferproxy listens on a staging name and renames it into place (socket-file), so
            // its file appearing means it listens. No probe connection: it would spend one of
            // inferproxy's admissions or fork a socat child.
            let deadline = Instant::now() + Duration::from_secs(10);
            let ready = |p: &Path| match peer {
                Peer::Inferproxy => p.exists(),
                _ => listening(p),
            };
            while !ready(&f.path) {
                assert!(Instant::now() < deadline, "{} did not start", peer.name());
                thread::sleep(Duration::from_millis(10));
            }
        }
        f
    }

    fn connect(&self) -> Box<dyn Duplex> {
        match self.peer {
            Peer::Direct => {
                let s = TcpStream::connect(&self.upstream).unwrap();
                s.set_nodelay(true).unwrap();
                Box::new(s)
            }
            _ => Box::new(UnixStream::connect(&self.path).unwrap()),
        }
    }

    /// Resident and proportional set size in KiB, summed over the process and its children
    /// (socat forks one per connection).
    fn memory_kib(&self) -> (u64, u64) {
        let Some(child) = &self.child else {
            return (0, 0);
        };
        let mut pids = vec![child.id()];
        for entry in fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            if field_kib(&status, "PPid:") == Some(child.id() as u64) {
                pids.push(pid);
            }
        }
        pids.iter().fold((0, 0), |(rss, pss), pid| {
            let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let rollup =
                fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
            (
                rss + field_kib(&status, "VmRSS:").unwrap_or(0),
                pss + field_kib(&rollup, "Pss:").unwrap_or(0),
            )
        })
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_file(&self.path);
    }
}

/// CPU time of the forwarder in clock ticks: its threads plus its reaped children (socat's
/// per-connection processes). Unlike wall time, this barely moves with load from other builds.
fn cpu_ticks(f: &Forwarder) -> u64 {
    let Some(child) = &f.child else { return 0 };
    let stat = fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
    // Fields after the parenthesised command name; utime, stime, cutime, cstime are 14 to 17.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split_whitespace()
        .skip(11)
        .take(4)
        .map(|v| v.parse::<u64>().unwrap())
        .sum()
}

/// Clock ticks per second on Linux (`getconf CLK_TCK`).
const TICKS_PER_SECOND: f64 = 100.0;

fn field_kib(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// Asks for `bytes` and reads them all; returns MB/s (10^6 bytes per second).
fn bulk(f: &Forwarder, bytes: u64) -> f64 {
    let mut c = f.connect();
    let mut req = vec![b'B'];
    req.extend_from_slice(&bytes.to_be_bytes());
    let started = Instant::now();
    c.write_all(&req).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    while got < bytes {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "{} ended early at {got}", f.peer.name());
        got += n as u64;
    }
    bytes as f64 / started.elapsed().as_secs_f64() / 1e6
}

/// Round trips of one 230-byte message on `c`, appended to `times` in microseconds.
fn ping_pong(c: &mut dyn Duplex, rounds: usize, times: &mut Vec<f64>) {
    let msg = [b'x'; MESSAGE];
    let mut back = [0u8; MESSAGE];
    for _ in 0..rounds {
        let t = Instant::now();
        c.write_all(&msg).unwrap();
        c.read_exact(&mut back).unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Opens 8 connections that each carried 1 MiB (so every copy buffer is touched), keeps them
/// open, and reads the forwarder's memory.
fn memory_with_live_connections(f: &Forwarder) -> ((u64, u64), (u64, u64)) {
    let idle = f.memory_kib();
    let live: Vec<_> = (0..LIVE_CONNECTIONS)
        .map(|_| {
            let mut c = f.connect();
            let mut req = vec![b'B'];
            req.extend_from_slice(&(1u64 << 20).to_be_bytes());
            c.write_all(&req).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            c.read_exact(&mut buf).unwrap();
            c
        })
        .collect();
    thread::sleep(Duration::from_millis(200));
    let busy = f.memory_kib();
    drop(live);
    (idle, busy)
}

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if !Path::new(SOCAT).exists() {
        eprintln!(
            "forward bench: {SOCAT} not found; `make socat` installs it (apt-get install socat)"
        );
        std::process::exit(1);
    }
    let mib = env_usize("INFERPROXY_BENCH_MIB", 1024) as u64;
    let pings = env_usize("INFERPROXY_BENCH_PINGS", 20_000);
    let stream_events = env_usize("INFERPROXY_BENCH_EVENTS", STREAM_EVENTS) as u32;
    let stream_gap_us = env_usize("INFERPROXY_BENCH_GAP_US", STREAM_GAP_US) as u32;
    let dir = std::env::temp_dir().join(format!("ipx-bench-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let peers = [Peer::Direct, Peer::Socat, Peer::Socat64k, Peer::Inferproxy];
    let per_peer = || vec![Vec::new(); peers.len()];
    let up = upstream();
    since_epoch_ns();
    if let Some(pin) = pinning() {
        pin_this_thread(pin.client);
        println!("pinned: {pin:?}");
    }

    // Ping-pong over a new connection per slice and peer, slices interleaving the peers so that
    // a burst of load on the shared box hits all alike. Each slice starts a new forwarder too:
    // inferproxy admits a burst of 10 connections, then 2 a second.
    let (mut fresh, mut fresh_p50) = (per_peer(), per_peer());
    for _ in 0..PING_SLICES {
        for (i, &peer) in peers.iter().enumerate() {
            let f = Forwarder::start(peer, &dir, &up);
            let mut c = f.connect();
            c.write_all(b"E").unwrap();
            ping_pong(&mut *c, WARM_UP_PINGS_FRESH, &mut Vec::new());
            let mut times = Vec::with_capacity(pings / PING_SLICES);
            ping_pong(&mut *c, pings / PING_SLICES, &mut times);
            times.sort_by(f64::total_cmp);
            fresh_p50[i].push(quantile(&times, 0.5));
            fresh[i].extend(times);
        }
    }

    // Ping-pong over one connection per peer held for the whole run, interleaved the same way.
    let mut held = per_peer();
    {
        let forwarders: Vec<_> = peers
            .iter()
            .map(|&p| Forwarder::start(p, &dir, &up))
            .collect();
        let mut conns: Vec<_> = forwarders
            .iter()
            .map(|f| {
                let mut c = f.connect();
                c.write_all(b"E").unwrap();
                ping_pong(&mut *c, WARM_UP_PINGS, &mut Vec::new());
                c
            })
            .collect();
        for _ in 0..PING_SLICES {
            for (c, times) in conns.iter_mut().zip(&mut held) {
                ping_pong(&mut **c, pings / PING_SLICES, times);
            }
        }
    }

    // The paced stream, a new forwarder and connection per slice and peer.
    let mut events = per_peer();
    for _ in 0..STREAM_SLICES {
        for (i, &peer) in peers.iter().enumerate() {
            let f = Forwarder::start(peer, &dir, &up);
            stream(&f, stream_events, stream_gap_us, &mut events[i]);
        }
    }

    let memory: Vec<_> = peers
        .iter()
        .map(|&peer| memory_with_live_connections(&Forwarder::start(peer, &dir, &up)))
        .collect();

    let (mut rates, mut cpu) = (per_peer(), per_peer());
    for _ in 0..BULK_RUNS {
        for (i, &peer) in peers.iter().enumerate() {
            let f = Forwarder::start(peer, &dir, &up);
            let before = cpu_ticks(&f);
            rates[i].push(bulk(&f, mib << 20));
            // Lets socat's child exit and be reaped, so that its time is counted.
            thread::sleep(Duration::from_millis(300));
            let ticks = cpu_ticks(&f) - before;
            cpu[i].push(ticks as f64 / TICKS_PER_SECOND / (mib as f64 / 1024.0));
        }
    }
    let _ = fs::remove_dir_all(&dir);
    for v in fresh
        .iter_mut()
        .chain(&mut fresh_p50)
        .chain(&mut held)
        .chain(&mut events)
    {
        v.sort_by(f64::total_cmp);
    }

    let direct_rate = median(rates[0].clone());
    let socat_rate = median(rates[1].clone());
    println!("bulk: {mib} MiB upstream -> client, median of {BULK_RUNS} runs; memory: {LIVE_CONNECTIONS} connections open, each has carried 1 MiB");
    println!();
    println!("| peer | bulk MB/s | vs socat | vs direct | CPU s/GiB | vs socat | RSS idle KiB | RSS {LIVE_CONNECTIONS} live KiB | PSS {LIVE_CONNECTIONS} live KiB |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let socat_cpu = median(cpu[1].clone());
    for (i, &peer) in peers.iter().enumerate() {
        let rate = median(rates[i].clone());
        let ((idle_rss, _), (rss, pss)) = memory[i];
        let dash = |text: String| {
            if peer == Peer::Direct {
                "-".to_owned()
            } else {
                text
            }
        };
        let cpu = median(cpu[i].clone());
        println!(
            "| {} | {rate:.0} | {:.2}x | {:.0}% | {} | {} | {} | {} | {} |",
            peer.name(),
            rate / socat_rate,
            100.0 * rate / direct_rate,
            dash(format!("{cpu:.2}")),
            dash(format!("{:.2}x", cpu / socat_cpu)),
            dash(idle_rss.to_string()),
            dash(rss.to_string()),
            dash(pss.to_string()),
        );
    }
    println!();
    println!(
        "bulk runs MB/s: {}",
        peers
            .iter()
            .zip(&rates)
            .map(|(p, r)| format!("{} {:.0?}", p.name(), r))
            .collect::<Vec<_>>()
            .join("; ")
    );
    // Each round ran the peers back to back, so a round's ratio is less exposed to load swings.
    let ours = peers.len() - 1;
    let per_round = |base: usize| {
        (0..BULK_RUNS)
            .map(|r| format!("{:.2}", rates[ours][r] / rates[base][r]))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "inferproxy/direct per round: {}; inferproxy/socat per round: {}",
        per_round(0),
        per_round(1)
    );
    println!();
    println!("ping-pong: {MESSAGE}-byte message and echo, {pings} round trips per peer each way; \"added\" is the peer's percentile minus direct TCP's");
    println!();
    println!("| peer | new connections: p50 µs | p99 µs | added p50 µs | added p99 µs | p50 per connection, min / median / max µs | held connection: p50 µs | p99 µs | added p50 µs | added p99 µs |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (i, &peer) in peers.iter().enumerate() {
        let c = &fresh_p50[i];
        println!(
            "| {} | {} | {:.1} / {:.1} / {:.1} | {} |",
            peer.name(),
            percentiles(&fresh[i], &fresh[0]),
            c[0],
            quantile(c, 0.5),
            c[c.len() - 1],
            percentiles(&held[i], &held[0]),
        );
    }
    println!();
    println!("paced stream: {STREAM_SLICES} connections per peer, each {stream_events} events of {MESSAGE} bytes {stream_gap_us} µs apart; latency from the upstream's write to the client's read");
    println!();
    println!("| peer | p50 µs | p99 µs | added p50 µs | added p99 µs |");
    println!("|---|---|---|---|---|");
    for (i, &peer) in peers.iter().enumerate() {
        println!(
            "| {} | {} |",
            peer.name(),
            percentiles(&events[i], &events[0])
        );
    }
}

/// `p50 | p99 | added p50 | added p99` of sorted `times` against sorted `direct`.
fn percentiles(times: &[f64], direct: &[f64]) -> String {
    let (p50, p99) = (quantile(times, 0.5), quantile(times, 0.99));
    let (d50, d99) = (quantile(direct, 0.5), quantile(direct, 0.99));
    format!("{p50:.1} | {p99:.1} | {:.1} | {:.1}", p50 - d50, p99 - d99)
}
