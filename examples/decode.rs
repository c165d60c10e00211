//! The decode half of the example pair: an OpenAI-style server (default
//! port 8020) around a simulated model, with the connector as
//! `kv_consumer`: it pulls each prompt's KV from the prefiller named in
//! `kv_transfer_params`, verifies every byte and generates from it.
//!
//! ```text
//! cargo run --example decode -- --port 8020 --tp 1
//! ```
use mooncake_connector::connector::KvRole;
use mooncake_connector::sim::cli::{init_logging, serve, ServeArgs};

#[tokio::main]
async fn main() {
    init_logging();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = ServeArgs::parse(&args, KvRole::Consumer, 8020).unwrap_or_else(|e| {
        eprintln!("decode: {e}");
        std::process::exit(2)
    });
    if let Err(e) = serve(parsed).await {
        eprintln!("decode: {e}");
        std::process::exit(1);
    }
}
