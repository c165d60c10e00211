//! What every connector worker (one per TP rank) owns: its transfer engine,
//! its registered KV cache and the layout of that cache.
use std::sync::Arc;

use mooncake::{Access, Engine, ErrorCode, HostBuffer, LocalMemory, Protocol, Registration};

use super::config::{ConnectorEnv, KvTransferConfig, MooncakeProtocol};
use super::error::ConnectorError;
use super::regions::{KvLayout, KvRegion};
use super::stats::ConnectorStats;

/// The geometry of one worker's KV cache: `regions` layer regions of
/// `num_blocks` blocks each, laid out back to back in one registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvCacheSpec {
    /// Layer names, one region each.
    pub layer_names: Vec<String>,
    /// Blocks per region.
    pub num_blocks: u64,
    /// Byte stride between blocks.
    pub block_len: u64,
    /// Payload bytes per block.
    pub kv_block_len: u64,
}

impl KvCacheSpec {
    /// Bytes of one region.
    pub fn region_bytes(&self) -> u64 {
        self.num_blocks * self.block_len
    }
}

/// A worker's shared state.
pub struct WorkerContext {
    /// The transfer engine of this worker.
    pub engine: Engine,
    /// The registered KV cache (remote-accessible, so decoders can be
    /// written into and prefillers read from).
    pub kv: Arc<Registration<HostBuffer>>,
    /// The cache's layout, with absolute addresses.
    pub layout: KvLayout,
    /// The cache's geometry.
    pub spec: KvCacheSpec,
    /// Connector configuration.
    pub config: KvTransferConfig,
    /// Environment settings.
    pub env: ConnectorEnv,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Counters shared with the rest of the process.
    pub stats: Arc<ConnectorStats>,
}

/// The engine protocol for a `mooncake_protocol` setting: `"tcp"` is TCP
/// alone; `"rdma"` is [`Protocol::Auto`] (upstream's auto-discovery: RDMA
/// when a usable HCA survives the `device_name` filter, else TCP;
/// `MC_FORCE_TCP` / `MC_FORCE_HCA` apply).
pub fn engine_protocol(setting: MooncakeProtocol) -> Protocol {
    match setting {
        MooncakeProtocol::Rdma => Protocol::Auto,
        MooncakeProtocol::Tcp => Protocol::Tcp,
    }
}

/// Starts a transfer engine the way the connector configures it:
/// advertised on `VLLM_HOST_IP`, the transport from `mooncake_protocol`
/// (see [`engine_protocol`]), the NIC allow-list from `device_name`, GPU
/// registration from `WITH_NVIDIA_PEERMEM` (read by the engine itself),
/// published in `metadata_server` when that names a store.
///
/// With `"rdma"` and no usable HCA (no verbs library, no device, none left
/// after `device_name`, ports down) the engine runs on TCP and a warning
/// names the reason; check [`Engine::has_rdma`].
pub fn build_engine(
    config: &KvTransferConfig,
    env: &ConnectorEnv,
) -> Result<Engine, ConnectorError> {
    let builder = || {
        Engine::builder()
            .local_host(env.host_ip.clone())
            .protocol(engine_protocol(config.mooncake_protocol))
            .device_allow_list(&config.device_name)
    };
    let engine = if config.metadata_server.is_centralised() {
        build_in_store(builder, config, env)?
    } else {
        builder().build()?
    };
    if config.mooncake_protocol == MooncakeProtocol::Rdma {
        match engine.rdma_topology() {
            Ok(topo) => {
                tracing::info!(target: "mooncake_connector", segment = engine.segment_name(),
                nics = ?topo.device_names(), "mooncake_protocol \"rdma\": using RDMA")
            }
            Err(e) => {
                let why = engine
                    .rdma_unavailable_reason()
                    .map_or_else(|| e.to_string(), str::to_string);
                tracing::warn!(target: "mooncake_connector", segment = engine.segment_name(),
                    device_name = ?config.device_name,
                    "mooncake_protocol \"rdma\": no usable RDMA device, falling back to TCP: {why}");
            }
        }
    }
    Ok(engine)
}

/// Builds an engine that publishes itself in `config.metadata_server`.
///
/// Peers address an engine as `"<VLLM_HOST_IP>:<handshake port>"` (the side
/// channel carries the host and the port, and the prefiller opens that
/// segment), so in a store the segment name must be that string, and the
/// port is known before the engine starts: a free port the kernel hands
/// out, chosen again if another process takes it first.
fn build_in_store(
    builder: impl Fn() -> mooncake::EngineBuilder,
    config: &KvTransferConfig,
    env: &ConnectorEnv,
) -> Result<Engine, ConnectorError> {
    const ATTEMPTS: usize = 8;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let port = std::net::TcpListener::bind(("0.0.0.0", 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| {
                ConnectorError::config(
                    "kv_connector_extra_config.metadata_server",
                    format!("no free port for the engine's handshake: {e}"),
                )
            })?
            .port();
        let built = builder()
            .metadata(config.metadata_server.clone())
            .segment_name(format!("{}:{port}", env.host_ip))
            .rpc_port(port)
            .build();
        match built {
            Ok(engine) => return Ok(engine),
            Err(e) if e.code() == ErrorCode::Socket && attempt < ATTEMPTS => {
                tracing::debug!(target: "mooncake_connector", port, "handshake port taken, choosing another: {e}");
            }
            Err(e) => return Err(e.into()),
        }
    }
}

impl WorkerContext {
    /// Builds the engine, allocates and registers the KV cache (one region
    /// per layer) and describes it.
    pub fn new(
        config: KvTransferConfig,
        env: ConnectorEnv,
        spec: KvCacheSpec,
        tp_size: usize,
        tp_rank: usize,
        dp_rank: u32,
        stats: Arc<ConnectorStats>,
    ) -> Result<Self, ConnectorError> {
        let engine = build_engine(&config, &env)?;
        let total = spec.region_bytes() * spec.layer_names.len() as u64;
        let mem = HostBuffer::new(total as usize)?;
        let kv = Arc::new(engine.register(mem, "*", Access::RemoteAccessible)?);
        let base = kv.addr();
        let regions = spec
            .layer_names
            .iter()
            .enumerate()
            .map(|(i, name)| KvRegion {
                base: base + i as u64 * spec.region_bytes(),
                block_len: spec.block_len,
                kv_block_len: spec.kv_block_len,
                layer_name: name.clone(),
                layer_index: i as i64,
                group_index: 0,
            })
            .collect();
        let layout = KvLayout {
            regions,
            tp_size,
            tp_rank,
        };
        Ok(Self {
            engine,
            kv,
            layout,
            spec,
            config,
            env,
            dp_rank,
            stats,
        })
    }

    /// Offset of block `block` of region `region` inside the registration.
    pub fn block_offset(&self, region: usize, block: u64) -> usize {
        (region as u64 * self.spec.region_bytes() + block * self.spec.block_len) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mooncake_protocol_maps_to_engine_protocol() {
        assert_eq!(engine_protocol(MooncakeProtocol::Rdma), Protocol::Auto);
        assert_eq!(engine_protocol(MooncakeProtocol::Tcp), Protocol::Tcp);
        // The default setting is "rdma", i.e. upstream's auto-discovery.
        let c = KvTransferConfig::from_json(
            r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_both"}"#,
        )
        .unwrap();
        assert_eq!(engine_protocol(c.mooncake_protocol), Protocol::Auto);
    }
}
