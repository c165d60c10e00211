//! What every connector worker (one per TP rank) owns: its transfer engine,
//! its registered KV cache and the layout of that cache.
use std::sync::Arc;

use mooncake::{Access, Engine, ErrorCode, HostBuffer, LocalMemory, Protocol, Registration};

use super::config::{ConnectorEnv, KvTransferConfig, MooncakeProtocol};
use super::error::ConnectorError;
use super::regions::{KvHeads, KvLayout, KvRegion};
use super::stats::ConnectorStats;

/// One layer's KV region in a worker's cache: block `b` at
/// `b × block_len` from the region's start, `kv_block_len` payload bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSpec {
    /// Layer name, e.g. `model.layers.0.self_attn.attn` (what regions are
    /// matched by across engines).
    pub name: String,
    /// Layer index in the model.
    pub index: i64,
    /// KV-cache group (hybrid models have several, each with its own block
    /// ids and block size).
    pub group: i64,
    /// Blocks in the region.
    pub num_blocks: u64,
    /// Byte stride between blocks.
    pub block_len: u64,
    /// Payload bytes per block (≤ `block_len`).
    pub kv_block_len: u64,
    /// The position (in [`KvCacheSpec::layers`]) of an earlier layer whose
    /// storage this layer uses: such a layer is registered once and its
    /// bytes move once.
    pub shares_with: Option<usize>,
}

/// The geometry of a model's KV cache as one worker (TP rank) sees it:
/// its layers' regions, back to back in one registration, and how heads are
/// spread over TP ranks. With PP, [`KvCacheSpec::stage`] gives the layers
/// one stage owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvCacheSpec {
    /// The layers, in registration order.
    pub layers: Vec<LayerSpec>,
    /// How KV heads are spread over TP ranks.
    pub heads: KvHeads,
    /// KV-cache groups of the whole model (a PP stage may own layers of
    /// only some; requests carry block ids for every group).
    pub groups: usize,
    /// Names of the model's layers that other PP stages own (empty for the
    /// whole model): a decoder of the same PP split that lists one of them
    /// for this stage splits the layers differently.
    pub other_stage_layers: Vec<String>,
}

impl KvCacheSpec {
    /// `layer_names.len()` layers of one group, each `num_blocks` blocks of
    /// `block_len` bytes with `kv_block_len` payload, heads split evenly.
    pub fn uniform(
        layer_names: Vec<String>,
        num_blocks: u64,
        block_len: u64,
        kv_block_len: u64,
    ) -> Self {
        Self {
            layers: layer_names
                .into_iter()
                .enumerate()
                .map(|(i, name)| LayerSpec {
                    name,
                    index: i as i64,
                    group: 0,
                    num_blocks,
                    block_len,
                    kv_block_len,
                    shares_with: None,
                })
                .collect(),
            heads: KvHeads::Split,
            groups: 1,
            other_stage_layers: Vec::new(),
        }
    }

    /// The layers PP stage `pp_rank` of `pp_size` owns, by layer index
    /// (the model's hidden-layer number): `partition` gives the layers of
    /// each stage (vLLM's `VLLM_PP_LAYER_PARTITION`); without it, the model's
    /// layers (up to the highest index) split as vLLM splits them, an even
    /// share each, the leftover going one each to the stages before the
    /// last. A layer sharing storage with a layer of another stage gets its
    /// own storage.
    pub fn stage(
        &self,
        pp_size: usize,
        pp_rank: usize,
        partition: Option<&[usize]>,
    ) -> Result<Self, ConnectorError> {
        let hidden = self
            .layers
            .iter()
            .map(|l| usize::try_from(l.index).map(|i| i + 1).unwrap_or(0))
            .max()
            .unwrap_or(0);
        let range = match partition {
            Some(p) => partition_range(p, hidden, pp_size, pp_rank)?,
            None => pp_layer_range(hidden, pp_size, pp_rank)?,
        };
        let owns = |l: &LayerSpec| usize::try_from(l.index).is_ok_and(|i| range.contains(&i));
        // Old position -> new position of the layers kept.
        let mut new_pos = vec![None; self.layers.len()];
        let mut layers = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            if owns(l) {
                new_pos[i] = Some(layers.len());
                layers.push(l.clone());
            }
        }
        for l in &mut layers {
            l.shares_with = l
                .shares_with
                .and_then(|j| new_pos.get(j).copied().flatten());
        }
        let other_stage_layers = self
            .layers
            .iter()
            .filter(|l| !owns(l))
            .map(|l| l.name.clone())
            .collect();
        Ok(Self {
            layers,
            heads: self.heads,
            groups: self.groups,
            other_stage_layers,
        })
    }

    /// Checks the layers: positive sizes, payload within the stride, a
    /// shared layer naming an earlier, unshared layer of the same geometry.
    pub fn validate(&self) -> Result<(), ConnectorError> {
        for (i, l) in self.layers.iter().enumerate() {
            if l.group < 0 || l.group as usize >= self.groups.max(1) {
                return Err(ConnectorError::config(
                    "KV cache",
                    format!(
                        "layer {:?} is in group {} of {}",
                        l.name, l.group, self.groups
                    ),
                ));
            }
            if l.num_blocks == 0 || l.block_len == 0 || l.kv_block_len == 0 {
                return Err(ConnectorError::config(
                    "KV cache",
                    format!("layer {:?} has an empty geometry", l.name),
                ));
            }
            if l.kv_block_len > l.block_len {
                return Err(ConnectorError::config(
                    "KV cache",
                    format!(
                        "layer {:?}: kv_block_len {} exceeds block_len {}",
                        l.name, l.kv_block_len, l.block_len
                    ),
                ));
            }
            if let Some(j) = l.shares_with {
                let ok = j < i
                    && self.layers[j].shares_with.is_none()
                    && self.layers[j].num_blocks == l.num_blocks
                    && self.layers[j].block_len == l.block_len
                    && self.layers[j].group == l.group;
                if !ok {
                    return Err(ConnectorError::config(
                        "KV cache",
                        format!("layer {:?} shares storage with layer {j}, which is not an earlier unshared layer of the same group and geometry", l.name),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Byte offset of each layer's region in the registration, and the
    /// registration's size.
    pub fn offsets(&self) -> Result<(Vec<u64>, u64), ConnectorError> {
        let mut offsets = Vec::with_capacity(self.layers.len());
        let mut total = 0u64;
        for l in &self.layers {
            match l.shares_with {
                Some(j) => offsets.push(offsets[j]),
                None => {
                    offsets.push(total);
                    total = l
                        .num_blocks
                        .checked_mul(l.block_len)
                        .and_then(|b| total.checked_add(b))
                        .ok_or_else(|| ConnectorError::config("KV cache", "size overflows"))?;
                }
            }
        }
        Ok((offsets, total))
    }

    /// The layout of a cache with this geometry registered at `base`, for
    /// TP rank `tp.1` of `tp.0` in PP stage `pp.1` of `pp.0`.
    pub fn layout(
        &self,
        base: u64,
        tp: (usize, usize),
        pp: (usize, usize),
    ) -> Result<KvLayout, ConnectorError> {
        let (offsets, _) = self.offsets()?;
        let regions = self
            .layers
            .iter()
            .zip(&offsets)
            .map(|(l, off)| KvRegion {
                base: base + off,
                block_len: l.block_len,
                kv_block_len: l.kv_block_len,
                layer_name: l.name.clone(),
                layer_index: l.index,
                group_index: l.group,
            })
            .collect();
        Ok(KvLayout {
            regions,
            tp_size: tp.0,
            tp_rank: tp.1,
            pp_size: pp.0,
            pp_rank: pp.1,
            heads: self.heads,
        })
    }

    /// The most blocks any region has (the bound for block ids on the
    /// wire).
    pub fn max_blocks(&self) -> u64 {
        self.layers.iter().map(|l| l.num_blocks).max().unwrap_or(0)
    }
}

/// The layers of stage `pp_rank` under an explicit partition (layer counts
/// per stage, summing to at least the model's `hidden` layers).
fn partition_range(
    partition: &[usize],
    hidden: usize,
    pp_size: usize,
    pp_rank: usize,
) -> Result<std::ops::Range<usize>, ConnectorError> {
    let total: usize = partition.iter().sum();
    if partition.len() != pp_size || pp_rank >= pp_size || total < hidden {
        return Err(ConnectorError::config(
            "VLLM_PP_LAYER_PARTITION",
            format!("{partition:?} does not split {hidden} layers into {pp_size} stages"),
        ));
    }
    let start: usize = partition[..pp_rank].iter().sum();
    Ok(start..start + partition[pp_rank])
}

/// The layers `[start, end)` PP stage `pp_rank` of `pp_size` owns out of
/// `layers` (vLLM's split: an even share each, the remainder one each to
/// the stages before the last, counting back).
pub fn pp_layer_range(
    layers: usize,
    pp_size: usize,
    pp_rank: usize,
) -> Result<std::ops::Range<usize>, ConnectorError> {
    if pp_size == 0 || pp_rank >= pp_size || layers < pp_size {
        return Err(ConnectorError::config(
            "pipeline_parallel_size",
            format!("{layers} layers cannot be split into {pp_size} stages (stage {pp_rank})"),
        ));
    }
    let mut sizes = vec![layers / pp_size; pp_size];
    for k in 0..layers % pp_size {
        // Stages pp-2, pp-3, ... take one more layer each (the last keeps
        // its share: it also runs the head of the model).
        let idx = (pp_size + pp_size - 2 - k) % pp_size;
        sizes[idx] += 1;
    }
    let start: usize = sizes[..pp_rank].iter().sum();
    Ok(start..start + sizes[pp_rank])
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
    /// Byte offset of each region in `kv`.
    pub offsets: Vec<u64>,
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
    /// per layer, shared storage once) and describes it. `spec` holds this
    /// worker's layers (its PP stage's, see [`KvCacheSpec::stage`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: KvTransferConfig,
        env: ConnectorEnv,
        spec: KvCacheSpec,
        (tp_size, tp_rank): (usize, usize),
        (pp_size, pp_rank): (usize, usize),
        dp_rank: u32,
        stats: Arc<ConnectorStats>,
    ) -> Result<Self, ConnectorError> {
        spec.validate()?;
        let (offsets, total) = spec.offsets()?;
        let engine = build_engine(&config, &env)?;
        let len = usize::try_from(total)
            .map_err(|_| ConnectorError::config("KV cache", "too large for this machine"))?;
        let mem = HostBuffer::new(len)?;
        let kv = Arc::new(engine.register(mem, "*", Access::RemoteAccessible)?);
        let layout = spec.layout(kv.addr(), (tp_size, tp_rank), (pp_size, pp_rank))?;
        Ok(Self {
            engine,
            kv,
            layout,
            spec,
            offsets,
            config,
            env,
            dp_rank,
            stats,
        })
    }

    /// Offset of block `block` of region `region` inside the registration.
    pub fn block_offset(&self, region: usize, block: u64) -> usize {
        (self.offsets[region] + block * self.spec.layers[region].block_len) as usize
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

    fn spec_of(indices: &[i64]) -> KvCacheSpec {
        let mut s = KvCacheSpec::uniform(
            indices.iter().map(|i| format!("layer{i}")).collect(),
            4,
            64,
            64,
        );
        for (l, &i) in s.layers.iter_mut().zip(indices) {
            l.index = i;
        }
        s
    }

    #[test]
    fn stages_own_layers_by_index_and_follow_a_partition() {
        // Layers 0..5, even split over 2 stages: 0..3 and 3..5.
        let s = spec_of(&[0, 1, 2, 3, 4]);
        let names = |x: &KvCacheSpec| x.layers.iter().map(|l| l.index).collect::<Vec<_>>();
        assert_eq!(names(&s.stage(2, 0, None).unwrap()), [0, 1, 2]);
        assert_eq!(names(&s.stage(2, 1, None).unwrap()), [3, 4]);
        assert_eq!(
            s.stage(2, 1, None).unwrap().other_stage_layers,
            ["layer0", "layer1", "layer2"]
        );
        // VLLM_PP_LAYER_PARTITION "1,4".
        assert_eq!(names(&s.stage(2, 0, Some(&[1, 4])).unwrap()), [0]);
        assert_eq!(names(&s.stage(2, 1, Some(&[1, 4])).unwrap()), [1, 2, 3, 4]);
        assert!(s.stage(2, 0, Some(&[1, 1])).is_err(), "too few layers");
        assert!(s.stage(2, 0, Some(&[5])).is_err(), "one entry per stage");
        // Layers without KV (indices 1 and 3 missing): split by index.
        let gaps = spec_of(&[0, 2, 4, 5]);
        assert_eq!(names(&gaps.stage(2, 0, None).unwrap()), [0, 2]);
        assert_eq!(names(&gaps.stage(2, 1, None).unwrap()), [4, 5]);
    }

    #[test]
    fn shared_storage_follows_the_layer_into_its_stage() {
        let mut s = spec_of(&[0, 1, 2, 3]);
        s.layers[3].shares_with = Some(1);
        s.layers[2].shares_with = Some(0);
        s.validate().unwrap();
        let (offsets, total) = s.offsets().unwrap();
        assert_eq!(offsets, [0, 256, 0, 256]);
        assert_eq!(total, 512);
        // Stage 1 owns layers 2 and 3, whose partners are on stage 0: they
        // get their own storage.
        let st = s.stage(2, 1, None).unwrap();
        assert_eq!(
            st.layers.iter().map(|l| l.shares_with).collect::<Vec<_>>(),
            [None, None]
        );
        // One stage with both: the sharing is kept, positions remapped.
        let all = s.stage(1, 0, None).unwrap();
        assert_eq!(all.layers[3].shares_with, Some(1));
        // A layer sharing with a later one is refused.
        let mut bad = spec_of(&[0, 1]);
        bad.layers[0].shares_with = Some(1);
        assert!(bad.validate().is_err());
    }
}
