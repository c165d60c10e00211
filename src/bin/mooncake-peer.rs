//! `mooncake-peer`: one engine of ours with one registered buffer, driven
//! line by line on stdin (see `mooncake_connector::peer_protocol`). Tests
//! use it as a second process, and it pairs with the upstream twin
//! `tests/interop/upstream_peer.py`.
//!
//! ```text
//! mooncake-peer [--size BYTES] [--seed N] [--local-host HOST]
//!               [--progress-timeout-ms MS] [--same-host on|off]
//!               [--metadata CONN --name SEGMENT [--metadata-lease-secs N]
//!                [--redis-password PW]]
//! ```
//!
//! With `--metadata` (a connection string: `etcd://...`, `redis://...`,
//! `http://...`) the engine publishes itself as `SEGMENT` in that store;
//! with `--metadata-lease-secs` its keys live on an etcd lease or Redis
//! expiry of N seconds that the engine keeps alive.
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::time::Duration;

use mooncake::{Access, Engine, HostBuffer, Registration, RemoteSegment};
use mooncake_connector::peer_protocol::Command;
use mooncake_connector::testkit::{check_pattern, fill_pattern};

struct Args {
    size: usize,
    seed: u64,
    local_host: String,
    progress_timeout_ms: u64,
    same_host: bool,
    metadata: Option<String>,
    name: Option<String>,
    lease_secs: u64,
    redis_password: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        size: 1 << 20,
        seed: 1,
        local_host: "127.0.0.1".into(),
        progress_timeout_ms: 5000,
        same_host: true,
        metadata: None,
        name: None,
        lease_secs: 0,
        redis_password: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--size" => a.size = val()?.parse().map_err(|_| "bad --size")?,
            "--seed" => a.seed = val()?.parse().map_err(|_| "bad --seed")?,
            "--local-host" => a.local_host = val()?,
            "--metadata" => a.metadata = Some(val()?),
            "--name" => a.name = Some(val()?),
            "--redis-password" => a.redis_password = Some(val()?),
            "--metadata-lease-secs" => {
                a.lease_secs = val()?.parse().map_err(|_| "bad --metadata-lease-secs")?
            }
            "--progress-timeout-ms" => {
                a.progress_timeout_ms = val()?.parse().map_err(|_| "bad --progress-timeout-ms")?
            }
            "--same-host" => {
                a.same_host = match val()?.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => return Err("--same-host takes on or off".into()),
                }
            }
            "-h" | "--help" => {
                return Err(
                    "usage: mooncake-peer [--size BYTES] [--seed N] [--local-host HOST] \
                            [--progress-timeout-ms MS] [--same-host on|off] \
                            [--metadata CONN --name SEGMENT [--metadata-lease-secs N] \
                            [--redis-password PW]]"
                        .into(),
                )
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

struct Peer {
    engine: Engine,
    buf: Registration<HostBuffer>,
    segments: HashMap<String, RemoteSegment>,
}

impl Peer {
    fn segment(&mut self, name: &str) -> Result<RemoteSegment, String> {
        if let Some(s) = self.segments.get(name) {
            return Ok(s.clone());
        }
        let s = self.engine.open_segment(name).map_err(|e| e.to_string())?;
        self.segments.insert(name.to_string(), s.clone());
        Ok(s)
    }

    fn run(&mut self, cmd: Command) -> Result<String, String> {
        match cmd {
            Command::Transfer {
                write,
                segment,
                remote_addr,
                local_offset,
                block,
                count,
                notify,
            } => {
                let seg = self.segment(&segment)?;
                let mut batch = self.engine.batch(count.max(1)).map_err(|e| e.to_string())?;
                for i in 0..count {
                    let (l, r) = (local_offset + i * block, remote_addr + (i * block) as u64);
                    let res = if write {
                        batch.write(&self.buf, l, &seg, r, block)
                    } else {
                        batch.read(&self.buf, l, &seg, r, block)
                    };
                    res.map_err(|e| e.to_string())?;
                }
                match &notify {
                    Some((n, m)) => batch.submit_with_notify(n, m),
                    None => batch.submit(),
                }
                .map_err(|e| e.to_string())?;
                batch.wait(None).map_err(|e| e.to_string())?;
                Ok(String::new())
            }
            Command::Probe(name) => {
                self.segment(&name)?.probe().map_err(|e| e.to_string())?;
                Ok(String::new())
            }
            Command::Fill { offset, len, seed } => {
                let mut data = vec![0u8; len];
                fill_pattern(&mut data, seed, offset);
                self.buf
                    .write_at(offset, &data)
                    .map_err(|e| e.to_string())?;
                Ok(String::new())
            }
            Command::Check {
                offset,
                len,
                seed,
                start,
            } => {
                let mut data = vec![0u8; len];
                self.buf
                    .read_at(offset, &mut data)
                    .map_err(|e| e.to_string())?;
                match check_pattern(&data, seed, start) {
                    None => Ok(String::new()),
                    Some(i) => Err(format!("mismatch at byte {} (offset {})", i, offset + i)),
                }
            }
            Command::Notifications => {
                let list = self.engine.notifications().map_err(|e| e.to_string())?;
                let pairs: Vec<[String; 2]> =
                    list.into_iter().map(|n| [n.name, n.message]).collect();
                Ok(serde_json::to_string(&pairs).expect("json"))
            }
            Command::Quit => unreachable!("handled by the loop"),
        }
    }
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut builder = Engine::builder()
        .local_host(args.local_host.clone())
        .tcp_progress_timeout(Duration::from_millis(args.progress_timeout_ms))
        .same_host_path(args.same_host);
    if let Some(conn) = &args.metadata {
        let metadata = conn.parse::<mooncake::Metadata>().unwrap_or_else(|e| {
            eprintln!("mooncake-peer: --metadata: {e}");
            std::process::exit(2);
        });
        builder = builder
            .metadata(metadata)
            .segment_name(args.name.clone().unwrap_or_default());
        if let Some(pw) = &args.redis_password {
            builder = builder.redis_auth(None, pw);
        }
        if args.lease_secs > 0 {
            builder = builder.metadata_lease_ttl(Duration::from_secs(args.lease_secs));
        }
    }
    let engine = builder.build().unwrap_or_else(|e| {
        eprintln!("mooncake-peer: cannot start the engine: {e}");
        std::process::exit(1);
    });
    let mut mem = HostBuffer::new(args.size).unwrap_or_else(|e| {
        eprintln!("mooncake-peer: {e}");
        std::process::exit(1);
    });
    fill_pattern(&mut mem, args.seed, 0);
    let buf = engine
        .register(mem, "*", Access::RemoteAccessible)
        .unwrap_or_else(|e| {
            eprintln!("mooncake-peer: cannot register memory: {e}");
            std::process::exit(1);
        });
    let ready = serde_json::json!({"segment": engine.segment_name(), "addr": mooncake::LocalMemory::addr(&buf), "len": args.size});
    let mut peer = Peer {
        engine,
        buf,
        segments: HashMap::new(),
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    writeln!(out, "READY {ready}")
        .and_then(|_| out.flush())
        .ok();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let reply = match Command::parse(&line) {
            Ok(Command::Quit) => break,
            Ok(cmd) => peer.run(cmd),
            Err(e) => Err(e),
        };
        let text = match reply {
            Ok(d) if d.is_empty() => "OK".to_string(),
            Ok(d) => format!("OK {d}"),
            Err(e) => format!("ERR {}", e.replace('\n', " ")),
        };
        if writeln!(out, "{text}").and_then(|_| out.flush()).is_err() {
            break;
        }
    }
}
