//! The prefill half of the example pair: an OpenAI-style server (default
//! port 8010) around a simulated model, with the connector as
//! `kv_producer` and the embedded bootstrap server on
//! `VLLM_MOONCAKE_BOOTSTRAP_PORT` (default 8998).
//!
//! ```text
//! cargo run --example prefill -- --port 8010 --tp 1
//! ```
use mooncake_connector::connector::KvRole;
use mooncake_connector::sim::cli::{init_logging, serve, ServeArgs};

#[tokio::main]
async fn main() {
    init_logging();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = ServeArgs::parse(&args, KvRole::Producer, 8010).unwrap_or_else(|e| {
        eprintln!("prefill: {e}");
        std::process::exit(2)
    });
    if let Err(e) = serve(parsed).await {
        eprintln!("prefill: {e}");
        std::process::exit(1);
    }
}
