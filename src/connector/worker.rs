//! What every connector worker (one per TP rank) owns: its transfer engine,
//! its registered KV cache and the layout of that cache.
use std::sync::Arc;

use mooncake::{Access, Engine, HostBuffer, LocalMemory, Registration};

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

/// Starts a transfer engine the way the connector configures it:
/// advertised on `VLLM_HOST_IP`, the NIC allow-list from `device_name`, GPU
/// registration from `WITH_NVIDIA_PEERMEM` (read by the engine itself).
pub fn build_engine(
    config: &KvTransferConfig,
    env: &ConnectorEnv,
) -> Result<Engine, ConnectorError> {
    if config.mooncake_protocol == MooncakeProtocol::Rdma {
        // Upstream installs RDMA only when it finds a usable HCA and falls
        // back to TCP otherwise. The engine has an RDMA transport now
        // (mooncake::Protocol::Auto would do exactly that), but the connector
        // keeps TCP until RDMA has run on real NICs with GPU memory.
        tracing::info!(target: "mooncake_connector", "mooncake_protocol \"rdma\": the connector uses TCP (RDMA not enabled in the connector yet)");
    }
    Ok(Engine::builder()
        .local_host(env.host_ip.clone())
        .device_allow_list(&config.device_name)
        .build()?)
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
