//! `mooncake-metadata-server`: the HTTP metadata service upstream Mooncake
//! engines use as `http://HOST:PORT/metadata`, compatible with upstream's
//! Python `mooncake_http_metadata_server` (see
//! `mooncake_connector::metadata_server`), with caps and timeouts.
//!
//! Prints `mooncake-metadata-server listening on http://ADDR/metadata` on
//! stdout once it accepts connections; logs go to stderr (`--log-level`,
//! or `RUST_LOG`). SIGINT or SIGTERM stops it gracefully.
use std::time::Duration;

use mooncake_connector::metadata_server::{serve, Config};

const USAGE: &str = "\
usage: mooncake-metadata-server [options]

  --host HOST                    address to bind (default 127.0.0.1; 0.0.0.0 for all)
  --port PORT                    port (default 8080, as upstream; 0 picks a free one)
  --log-level LEVEL              debug, info, warning, error or critical (default info;
                                 RUST_LOG, when set, wins)
  --max-body-bytes N             largest PUT body (default 1048576, as upstream's
                                 aiohttp; 1..=1073741824, at most
                                 --max-inflight-body-bytes)
  --max-inflight-body-bytes N    request body bytes held at once, all connections
                                 together; over it a PUT gets 503 (default 67108864;
                                 1..=17179869184)
  --max-key-bytes N              longest key (default 4096; 1..=1048576)
  --max-keys N                   most keys held (default 65536; 1..=4294967296)
  --max-total-bytes N            most bytes held, keys and values (default 1073741824;
                                 1..=1099511627776)
  --max-connections N            connections served at once (default 1024; 1..=1048576)
  --max-connections-per-ip N     connections served at once from one client address;
                                 more are closed at once (default 128; 1..=1048576)
  --idle-timeout-secs S          close connections idle this long (default 60; 1..=86400)
  --request-timeout-secs S       a request must arrive, and its answer be written out,
                                 within this (default 10; 1..=3600)
  --allow-rpc-meta-overwrite     let a PUT replace an existing rpc_meta key (upstream
                                 refuses: an engine restarting under the same segment
                                 name then fails until its stale key is deleted)
  -h, --help                     this text";

struct Args {
    host: String,
    port: u16,
    log_level: String,
    config: Config,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        host: "127.0.0.1".into(),
        port: 8080,
        log_level: "info".into(),
        config: Config::default(),
    };
    // Every number within a range that cannot overflow a deadline or a
    // semaphore, named in the error.
    fn num(flag: &str, v: String, range: std::ops::RangeInclusive<u64>) -> Result<u64, String> {
        let (lo, hi) = (range.start(), range.end());
        match v.parse::<u64>() {
            Ok(n) if range.contains(&n) => Ok(n),
            _ => Err(format!(
                "{flag}: expected a whole number from {lo} to {hi}, got {v:?}"
            )),
        }
    }
    // All ranges fit in usize on the 64-bit targets we build for; on a
    // smaller one, the value is capped there.
    fn size(n: u64) -> usize {
        usize::try_from(n).unwrap_or(usize::MAX)
    }
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        // Both `--flag value` and `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut val = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let c = &mut a.config;
        match flag.as_str() {
            "--host" => a.host = val()?,
            "--port" => a.port = num(&flag, val()?, 0..=65535)? as u16,
            "--log-level" => {
                a.log_level = match val()?.to_ascii_lowercase().as_str() {
                    "debug" => "debug",
                    "info" => "info",
                    "warning" | "warn" => "warn",
                    "error" | "critical" => "error",
                    other => return Err(format!("--log-level: unknown level {other:?}")),
                }
                .into()
            }
            "--max-body-bytes" => c.max_body_bytes = size(num(&flag, val()?, 1..=1 << 30)?),
            "--max-inflight-body-bytes" => {
                c.max_inflight_body_bytes = size(num(&flag, val()?, 1..=1 << 34)?)
            }
            "--max-key-bytes" => c.limits.max_key_bytes = size(num(&flag, val()?, 1..=1 << 20)?),
            "--max-keys" => c.limits.max_keys = size(num(&flag, val()?, 1..=1 << 32)?),
            "--max-total-bytes" => {
                c.limits.max_total_bytes = size(num(&flag, val()?, 1..=1 << 40)?)
            }
            "--max-connections" => c.max_connections = size(num(&flag, val()?, 1..=1 << 20)?),
            "--max-connections-per-ip" => {
                c.max_connections_per_ip = size(num(&flag, val()?, 1..=1 << 20)?)
            }
            "--idle-timeout-secs" => {
                c.idle_timeout = Duration::from_secs(num(&flag, val()?, 1..=86_400)?)
            }
            "--request-timeout-secs" => {
                c.request_timeout = Duration::from_secs(num(&flag, val()?, 1..=3_600)?)
            }
            "--allow-rpc-meta-overwrite" if inline.is_none() => c.allow_rpc_meta_overwrite = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let c = &a.config;
    if c.max_body_bytes > c.max_inflight_body_bytes {
        return Err(format!(
            "--max-body-bytes ({}) must not exceed --max-inflight-body-bytes ({}): \
             such a body could never be taken in",
            c.max_body_bytes, c.max_inflight_body_bytes
        ));
    }
    Ok(a)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM ({e}); stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutting down");
}

fn main() {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e == USAGE => {
            println!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("mooncake-metadata-server: {e}");
            std::process::exit(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&args.log_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mooncake-metadata-server: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(run(args));
    // Connections still open after the grace period are dropped here.
    rt.shutdown_timeout(Duration::from_millis(100));
    std::process::exit(code);
}

async fn run(args: Args) -> i32 {
    let listener = match tokio::net::TcpListener::bind((args.host.as_str(), args.port)).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "mooncake-metadata-server: cannot listen on {}:{}: {e}",
                args.host, args.port
            );
            return 1;
        }
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mooncake-metadata-server: {e}");
            return 1;
        }
    };
    let c = &args.config;
    tracing::info!(
        %addr,
        max_body_bytes = c.max_body_bytes,
        max_inflight_body_bytes = c.max_inflight_body_bytes,
        max_connections = c.max_connections,
        max_connections_per_ip = c.max_connections_per_ip,
        max_key_bytes = c.limits.max_key_bytes,
        max_keys = c.limits.max_keys,
        max_total_bytes = c.limits.max_total_bytes,
        allow_rpc_meta_overwrite = c.allow_rpc_meta_overwrite,
        "metadata server started"
    );
    println!("mooncake-metadata-server listening on http://{addr}/metadata");
    let grace = c.request_timeout.saturating_add(Duration::from_secs(1));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, args.config, async move {
        let _ = stop_rx.await;
    }));
    shutdown_signal().await;
    let _ = stop_tx.send(());
    // Requests under way finish (each within the request timeout); then
    // the process ends even if a client keeps an idle connection open.
    match tokio::time::timeout(grace, server).await {
        Ok(Ok(Ok(()))) => 0,
        Ok(Ok(Err(e))) => {
            eprintln!("mooncake-metadata-server: {e}");
            1
        }
        Ok(Err(e)) => {
            eprintln!("mooncake-metadata-server: server task failed: {e}");
            1
        }
        Err(_) => {
            tracing::warn!("connections still open after {grace:?}; exiting anyway");
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> Result<Args, String> {
        parse_args(v.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_and_flags() {
        let a = parse(&[]).unwrap();
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 8080));
        assert_eq!(a.config, Config::default());
        let a = parse(&[
            "--host",
            "0.0.0.0",
            "--port=9000",
            "--log-level",
            "WARNING",
            "--max-body-bytes",
            "10",
            "--max-keys=3",
            "--allow-rpc-meta-overwrite",
        ])
        .unwrap();
        assert_eq!((a.host.as_str(), a.port), ("0.0.0.0", 9000));
        assert_eq!(a.log_level, "warn");
        assert_eq!(a.config.max_body_bytes, 10);
        assert_eq!(a.config.limits.max_keys, 3);
        assert!(a.config.allow_rpc_meta_overwrite);
        assert!(parse(&["--port", "x"]).is_err());
        assert!(parse(&["--port"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
        assert!(parse(&["--log-level", "loud"]).is_err());
        let a = parse(&[
            "--max-connections-per-ip=2",
            "--max-inflight-body-bytes",
            "1000",
            "--max-body-bytes=1000",
        ])
        .unwrap();
        assert_eq!(a.config.max_connections_per_ip, 2);
        assert_eq!(a.config.max_inflight_body_bytes, 1000);
    }

    #[test]
    fn numbers_out_of_range_name_the_flag() {
        for (flag, bad) in [
            ("--port", "65536"),
            ("--max-connections", "0"),
            ("--max-connections", "18446744073709551615"),
            ("--max-connections-per-ip", "0"),
            ("--max-body-bytes", "0"),
            ("--max-body-bytes", "1073741825"),
            ("--max-inflight-body-bytes", "17179869185"),
            ("--max-key-bytes", "0"),
            ("--max-keys", "0"),
            ("--max-total-bytes", "99999999999999999999"),
            ("--idle-timeout-secs", "0"),
            ("--idle-timeout-secs", "18446744073709551615"),
            ("--request-timeout-secs", "0"),
            ("--request-timeout-secs", "3601"),
            ("--request-timeout-secs", "-1"),
        ] {
            let e = parse(&[flag, bad])
                .err()
                .unwrap_or_else(|| panic!("{flag} {bad}"));
            assert!(
                e.starts_with(flag) && e.contains(" to "),
                "{flag} {bad}: {e}"
            );
        }
        let e = parse(&["--max-body-bytes=2000", "--max-inflight-body-bytes=1000"])
            .err()
            .unwrap();
        assert!(e.contains("--max-inflight-body-bytes"), "{e}");
    }
}
