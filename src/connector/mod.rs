//! The MooncakeConnector equivalent: configuration, the bootstrap server and
//! client, the ZMQ side channel with vLLM's msgpack messages, the KV region
//! and descriptor planning, the producer (prefill) and consumer (decode)
//! workers, and [`Connector::start`], the entry point that wires them up.

pub mod bootstrap;
pub mod config;
pub mod consumer;
pub mod error;
pub mod producer;
pub mod protocol;
pub mod regions;
pub mod start;
pub mod stats;
pub mod worker;
pub mod zmtp_guard;

pub use config::{
    ConnectorEnv, HostPort, KvRole, KvTransferConfig, LoadFailurePolicy, MooncakeProtocol,
};
pub use consumer::{Consumer, LoadFailure, PullOutcome, PullRequest};
pub use error::{ConnectorError, ConnectorErrorCode};
pub use producer::{Producer, ProducerEvent};
pub use regions::KvHeads;
pub use start::{Connector, ConnectorOptions, ConnectorRank};
pub use stats::{ConnectorStats, StatsSnapshot};
pub use worker::{
    build_engine, engine_protocol, pp_layer_range, KvCacheSpec, LayerSpec, WorkerContext,
};
