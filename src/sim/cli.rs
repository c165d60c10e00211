//! Command-line handling shared by the `prefill` and `decode` examples.
use std::time::Duration;

use super::engine::SimEngineConfig;
use super::model::ModelSpec;
use crate::connector::{ConnectorEnv, KvRole, KvTransferConfig};

/// Flags of a simulated engine server.
#[derive(Debug, Clone)]
pub struct ServeArgs {
    /// `--host` (default 127.0.0.1).
    pub host: String,
    /// `--port`.
    pub port: u16,
    /// Everything the engine needs.
    pub engine: SimEngineConfig,
}

const USAGE: &str = "flags: [--host H] [--port P] [--kv-transfer-config JSON] [--tp N] [--pp N] [--layers N] [--heads N] \
[--head-size N] [--block-size N] [--num-blocks N] [--mla] [--hybrid] [--max-num-seqs N] [--prefill-us-per-token N] [--remote-decode-block-budget N] [--model NAME]
env: VLLM_MOONCAKE_BOOTSTRAP_PORT, VLLM_MOONCAKE_CONNECTOR_TIMEOUT, VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, VLLM_HOST_IP";

impl ServeArgs {
    /// Parses `args` (without the program name) for an engine whose
    /// defaults are `role` and `port`.
    pub fn parse(args: &[String], role: KvRole, port: u16) -> Result<Self, String> {
        let mut host = "127.0.0.1".to_string();
        let mut port = port;
        let mut kv_json = format!(
            r#"{{"kv_connector":"MooncakeConnector","kv_role":"{}"}}"#,
            role.as_str()
        );
        let mut spec = ModelSpec::default();
        let mut tp = 1usize;
        let mut pp = 1usize;
        let mut max_num_seqs = 64usize;
        let mut us_per_token = 0u64;
        let mut budget: Option<usize> = None;
        let mut model_name = "mooncake-rs-sim".to_string();
        let mut i = 0;
        while i < args.len() {
            let flag = args[i].as_str();
            // Switches take no value.
            match flag {
                "--mla" => spec.mla = true,
                "--hybrid" => spec.hybrid = true,
                _ => {}
            }
            if matches!(flag, "--mla" | "--hybrid") {
                i += 1;
                continue;
            }
            let val = args
                .get(i + 1)
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"));
            let num = |v: Result<String, String>| -> Result<usize, String> {
                let v = v?;
                v.parse()
                    .map_err(|_| format!("{flag}: {v:?} is not a number"))
            };
            match flag {
                "--host" => host = val?,
                "--port" => {
                    port = num(val)?
                        .try_into()
                        .map_err(|_| "--port: out of range".to_string())?
                }
                "--kv-transfer-config" => kv_json = val?,
                "--tp" => tp = num(val)?,
                "--pp" => pp = num(val)?,
                "--layers" => spec.layers = num(val)?,
                "--heads" => spec.heads = num(val)?,
                "--head-size" => spec.head_size = num(val)?,
                "--block-size" => spec.block_size = num(val)?,
                "--num-blocks" => spec.num_blocks = num(val)?,
                "--max-num-seqs" => max_num_seqs = num(val)?,
                "--prefill-us-per-token" => us_per_token = num(val)? as u64,
                "--remote-decode-block-budget" => budget = Some(num(val)?),
                "--model" => model_name = val?,
                "-h" | "--help" => return Err(USAGE.into()),
                other => return Err(format!("unknown flag {other}\n{USAGE}")),
            }
            i += 2;
        }
        let kv = KvTransferConfig::from_json(&kv_json).map_err(|e| e.to_string())?;
        let env = ConnectorEnv::from_env().map_err(|e| e.to_string())?;
        spec.validate(tp)?;
        crate::connector::pp_layer_range(spec.layers, pp, 0).map_err(|e| e.detail)?;
        // Default: half the cache may wait for remote decoders.
        let budget = budget.unwrap_or(spec.num_blocks.div_ceil(2));
        Ok(Self {
            host,
            port,
            engine: SimEngineConfig {
                kv,
                env,
                spec,
                tp,
                pp,
                dp_rank: 0,
                model_name,
                max_num_seqs,
                prefill_time_per_token: Duration::from_micros(us_per_token),
                remote_decode_block_budget: budget,
            },
        })
    }
}

/// Runs an engine server until Ctrl-C.
pub async fn serve(args: ServeArgs) -> Result<(), String> {
    let engine = super::engine::SimEngine::start(args.engine.clone())
        .await
        .map_err(|e| e.to_string())?;
    let app = super::server::router(engine.clone());
    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot bind {addr}: {e}"))?;
    tracing::info!(target: "mooncake_connector::sim", role = args.engine.kv.kv_role.as_str(), %addr,
        engine_id = %args.engine.kv.engine_id, bootstrap = ?engine.bootstrap_url(), "serving");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| e.to_string())
}

/// Logging for the example binaries: `RUST_LOG`, default `info`.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
