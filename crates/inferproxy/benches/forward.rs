//! inferproxy against socat and a direct TCP connection, side by side in one run.
//!
//! `cargo bench -p inferproxy --bench forward` (or `make bench`, which installs socat when
//! missing; this binary needs it at /usr/bin/socat). Prints a Markdown table:
//! bulk throughput upstream -> client, 230-byte ping-pong round trips (p50/p99 and what the
//! forwarder adds over direct TCP), and resident memory with 8 live connections.
//! `INFERPROXY_BENCH_MIB` (default 1024) sets the bulk size per run; three runs per peer,
//! interleaved, and the median is reported. `INFERPROXY_BENCH_PINGS` (default 20000) sets the
//! number of measured round trips per peer.

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
const WARM_UP_PINGS: usize = 1000;
const PING_SLICES: usize = 20;
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
            thread::spawn(move || serve(stream));
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

impl Forwarder {
    fn start(peer: Peer, dir: &Path, upstream: &str) -> Self {
        let path = dir.join(format!("{}.sock", peer.name().replace([' ', '-'], "")));
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
        let f = Self {
            peer,
            child,
            path,
            upstream: upstream.to_owned(),
        };
        if peer != Peer::Direct {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !f.path.exists() {
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
    let dir = std::env::temp_dir().join(format!("ipx-bench-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let up = upstream();
    let peers = [Peer::Direct, Peer::Socat, Peer::Socat64k, Peer::Inferproxy];

    let mut rates = vec![Vec::new(); peers.len()];
    let mut rtts = vec![Vec::new(); peers.len()];
    let mut memory = Vec::new();
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
        // Interleaved in slices so that a burst of load on the shared box hits every peer alike.
        for _ in 0..PING_SLICES {
            for (c, times) in conns.iter_mut().zip(&mut rtts) {
                ping_pong(&mut **c, pings / PING_SLICES, times);
            }
        }
        drop(conns);
        for f in &forwarders {
            memory.push(memory_with_live_connections(f));
        }
    }
    for times in &mut rtts {
        times.sort_by(f64::total_cmp);
    }
    let mut cpu = vec![Vec::new(); peers.len()];
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

    let direct_rate = median(rates[0].clone());
    let socat_rate = median(rates[1].clone());
    let (direct_p50, direct_p99) = (quantile(&rtts[0], 0.5), quantile(&rtts[0], 0.99));
    println!(
        "bulk: {mib} MiB upstream -> client, median of {BULK_RUNS}; ping-pong: {pings} round trips of {MESSAGE} bytes"
    );
    println!();
    println!("| peer | bulk MB/s | vs socat | vs direct | RTT p50 µs | RTT p99 µs | added p50 µs | added p99 µs | RSS idle KiB | RSS 8 live KiB | PSS 8 live KiB |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, &peer) in peers.iter().enumerate() {
        let rate = median(rates[i].clone());
        let (p50, p99) = (quantile(&rtts[i], 0.5), quantile(&rtts[i], 0.99));
        let ((idle_rss, _), (rss, pss)) = memory[i];
        let mem = |v: u64| {
            if peer == Peer::Direct {
                "-".to_owned()
            } else {
                v.to_string()
            }
        };
        println!(
            "| {} | {rate:.0} | {:.2}x | {:.0}% | {p50:.1} | {p99:.1} | {:.1} | {:.1} | {} | {} | {} |",
            peer.name(),
            rate / socat_rate,
            100.0 * rate / direct_rate,
            p50 - direct_p50,
            p99 - direct_p99,
            mem(idle_rss),
            mem(rss),
            mem(pss),
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
    println!(
        "forwarder CPU seconds per GiB (median): {}",
        peers
            .iter()
            .zip(&cpu)
            .skip(1)
            .map(|(p, c)| format!("{} {:.2}", p.name(), median(c.clone())))
            .collect::<Vec<_>>()
            .join("; ")
    );
    // Each round ran the peers back to back, so a round's ratio is less exposed to load swings.
    let ours = rates.len() - 1;
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
}
