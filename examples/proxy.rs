//! The disaggregation proxy (default 127.0.0.1:8000), with the flags of
//! vLLM's `mooncake_connector_proxy.py`:
//!
//! ```text
//! cargo run --example proxy -- --prefill http://127.0.0.1:8010 [8998|none] \
//!     --decode http://127.0.0.1:8020 [--bootstrap-addr HOST:PORT] [--completions-only]
//! ```
//!
//! Besides vLLM's routes it serves `GET /health` and `GET /v1/models` (503
//! until the prefill instances are found); `--completions-only` leaves them
//! out, as vLLM's proxy does, to check clients against it.
use mooncake_connector::sim::cli::init_logging;
use mooncake_connector::sim::proxy::{Proxy, ProxyConfig};

#[tokio::main]
async fn main() {
    init_logging();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = ProxyConfig::from_args(&args).unwrap_or_else(|e| {
        eprintln!("proxy: {e}");
        std::process::exit(2)
    });
    let addr = format!("{}:{}", cfg.host, cfg.port);
    let proxy = Proxy::new(cfg);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .unwrap_or_else(|e| {
            eprintln!("proxy: cannot bind {addr}: {e}");
            std::process::exit(1)
        });
    let app = proxy.router();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
    });
    tracing::info!(target: "mooncake_connector::proxy", %addr, "proxy listening (503 until prefill instances are ready)");
    if let Err(e) = proxy.discover().await {
        eprintln!("proxy: {e}");
        std::process::exit(1);
    }
    tracing::info!(target: "mooncake_connector::proxy", "ready");
    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            eprintln!("proxy: {e}");
            std::process::exit(1)
        }
        Err(e) => {
            eprintln!("proxy: {e}");
            std::process::exit(1)
        }
    }
}
