//! The bootstrap server (embedded in the prefiller's rank 0) and its client:
//! prefill workers register their side-channel addresses, decoders look them
//! up. JSON shapes, status codes and conflict rules follow vLLM's
//! MooncakeConnector.

mod client;
mod server;
mod table;
mod validate;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use client::{BootstrapClient, RetryPolicy};
pub use server::BootstrapServer;
pub use validate::{parse_register, parse_side_channel};

/// `POST /register` body. Besides vLLM's five fields it carries the newer
/// body's `tp_size`/`pp_size` (vLLM's newer server needs `tp_size` for a
/// TP > 1 registration) and our `dp_size`, which a vLLM server ignores.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// The prefill engine's id.
    pub engine_id: String,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Tensor-parallel rank.
    pub tp_rank: u32,
    /// Pipeline-parallel rank.
    pub pp_rank: u32,
    /// The worker's ZMQ side-channel endpoint, `tcp://<ip>:<port>`.
    pub addr: String,
    /// The engine's TP size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_size: Option<u32>,
    /// The engine's PP size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pp_size: Option<u32>,
    /// How many DP ranks the cluster has (an extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_size: Option<u32>,
}

/// Largest request body `/register` reads.
pub const MAX_BODY: usize = 16 * 1024;
/// Longest engine id.
pub const MAX_ENGINE_ID: usize = 128;
/// Largest TP size a registration may announce.
pub const MAX_TP: u32 = 1024;
/// Largest PP size a registration may announce.
pub const MAX_PP: u32 = 64;
/// Most DP ranks the table holds.
pub const MAX_DP_RANKS: usize = 256;
/// Most workers the table holds.
pub const MAX_WORKERS: usize = 4096;
/// Environment variable holding the optional shared registration token.
pub const TOKEN_ENV: &str = "MOONCAKE_BOOTSTRAP_TOKEN";

/// One data-parallel rank in the `/query` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DpEntry {
    /// The engine id that owns this DP rank.
    pub engine_id: String,
    /// tp rank → pp rank → side-channel address (JSON keys are strings).
    pub worker_addr: BTreeMap<String, BTreeMap<String, String>>,
}

/// The `/query` answer: DP rank (as a string) → entry.
pub type QueryTable = BTreeMap<String, DpEntry>;

/// The topology a server must see before `/query` answers, so that a
/// decoder never derives a wrong TP size from a half-registered table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpectedTopology {
    /// DP ranks.
    pub dp_size: u32,
    /// TP ranks per DP rank.
    pub tp_size: u32,
    /// PP ranks per TP rank.
    pub pp_size: u32,
}
