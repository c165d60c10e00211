//! The side-channel messages, field for field as vLLM's msgspec structs
//! `MooncakeXferMetadata` and `MooncakeXferResponse` (generation 3): msgpack
//! maps keyed by field name, fields that hold their default left out, unknown
//! keys ignored when decoding.
use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::{ConnectorError, ConnectorErrorCode};

/// Block ids of one request, one list per KV-cache group.
pub type GroupBlocks = Vec<Vec<u64>>;

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

fn is_one(v: &u64) -> bool {
    *v == 1
}

fn one() -> u64 {
    1
}

/// Decoder → prefiller: "write these requests' KV into my blocks".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XferMetadata {
    /// The decoder worker's IP.
    pub remote_hostname: String,
    /// The decoder worker's transfer-engine handshake (RPC) port.
    pub remote_port: u64,
    /// The decoder's TP size.
    pub remote_tp_size: u64,
    /// This decoder worker's TP rank.
    pub remote_tp_rank: u64,
    /// Decoder request id → (transfer id, block ids per KV-cache group).
    pub req_blocks: BTreeMap<String, (String, GroupBlocks)>,
    /// Base address of each registered KV region on the decoder.
    pub kv_caches_base_addr: Vec<u64>,
    /// Per region: byte stride between consecutive blocks.
    pub block_lens: Vec<u64>,
    /// Per region: payload bytes per block.
    pub kv_block_lens: Vec<u64>,
    /// Layer name of each region.
    #[serde(default, skip_serializing_if = "is_default")]
    pub registered_layer_names: Vec<String>,
    /// Layer index of each region.
    #[serde(default, skip_serializing_if = "is_default")]
    pub registered_layer_indices: Vec<i64>,
    /// KV-cache group of each region.
    #[serde(default, skip_serializing_if = "is_default")]
    pub registered_group_indices: Vec<i64>,
    /// The decoder's PP size.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub remote_pp_size: u64,
}

/// Largest TP size a pull may name.
pub const MAX_TP_SIZE: u64 = 1024;
/// Largest PP size a pull may name.
pub const MAX_PP_SIZE: u64 = 64;
/// Most requests one pull may carry.
pub const MAX_REQS_PER_PULL: usize = 4096;
/// Most KV-cache groups one request may name.
pub const MAX_GROUPS: usize = 64;
/// Most KV regions a pull may describe.
pub const MAX_REGIONS: usize = 4096;
/// Longest id or layer name.
pub const MAX_ID_LEN: usize = 256;
/// Largest per-block stride.
pub const MAX_BLOCK_LEN: u64 = 1 << 40;

/// What the receiving worker knows that bounds a pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullBounds {
    /// Blocks per region on this worker: no request can name more.
    pub num_blocks: u64,
    /// KV-cache groups on this worker.
    pub num_groups: usize,
}

fn invalid(field: &str, why: impl std::fmt::Display) -> ConnectorError {
    ConnectorError::new(
        ConnectorErrorCode::Protocol,
        format!("invalid field {field}: {why}"),
    )
}

fn check_id(field: &str, v: &str) -> Result<(), ConnectorError> {
    if v.is_empty() || v.len() > MAX_ID_LEN {
        return Err(invalid(
            field,
            format!("length {} is not in 1..={MAX_ID_LEN}", v.len()),
        ));
    }
    Ok(())
}

impl XferMetadata {
    /// Checks every field against sane limits and against each other before
    /// anything is allocated or computed from them; the error names the
    /// field. The checks run in wire field order (the peer, its regions,
    /// the requests), so they read against the message definition.
    pub fn validate(&self, b: &PullBounds) -> Result<(), ConnectorError> {
        self.validate_peer()?;
        let n = self.validate_regions()?;
        self.validate_requests(b, n)
    }

    /// The decoder's address and parallel layout.
    fn validate_peer(&self) -> Result<(), ConnectorError> {
        let h = &self.remote_hostname;
        if h.is_empty()
            || h.len() > 253
            || !h
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b".-:_[]%".contains(&c))
        {
            return Err(invalid(
                "remote_hostname",
                format!("{:?} is not a host name or IP address", truncate(h)),
            ));
        }
        if !(1..=65535).contains(&self.remote_port) {
            return Err(invalid(
                "remote_port",
                format!("{} is not a port", self.remote_port),
            ));
        }
        if !(1..=MAX_TP_SIZE).contains(&self.remote_tp_size) {
            return Err(invalid(
                "remote_tp_size",
                format!("{} is not in 1..={MAX_TP_SIZE}", self.remote_tp_size),
            ));
        }
        if self.remote_tp_rank >= self.remote_tp_size {
            return Err(invalid(
                "remote_tp_rank",
                format!(
                    "{} is not below remote_tp_size {}",
                    self.remote_tp_rank, self.remote_tp_size
                ),
            ));
        }
        if !(1..=MAX_PP_SIZE).contains(&self.remote_pp_size) {
            return Err(invalid(
                "remote_pp_size",
                format!("{} is not in 1..={MAX_PP_SIZE}", self.remote_pp_size),
            ));
        }
        Ok(())
    }

    /// The decoder's KV regions; their number.
    fn validate_regions(&self) -> Result<usize, ConnectorError> {
        let n = self.kv_caches_base_addr.len();
        if n == 0 || n > MAX_REGIONS {
            return Err(invalid(
                "kv_caches_base_addr",
                format!("{n} regions is not in 1..={MAX_REGIONS}"),
            ));
        }
        for (field, len) in [
            ("block_lens", self.block_lens.len()),
            ("kv_block_lens", self.kv_block_lens.len()),
        ] {
            if len != n {
                return Err(invalid(field, format!("{len} entries for {n} regions")));
            }
        }
        for (field, len) in [
            ("registered_layer_names", self.registered_layer_names.len()),
            (
                "registered_layer_indices",
                self.registered_layer_indices.len(),
            ),
            (
                "registered_group_indices",
                self.registered_group_indices.len(),
            ),
        ] {
            if len != 0 && len != n {
                return Err(invalid(field, format!("{len} entries for {n} regions")));
            }
        }
        if let Some(name) = self
            .registered_layer_names
            .iter()
            .find(|s| s.len() > MAX_ID_LEN)
        {
            return Err(invalid(
                "registered_layer_names",
                format!("a name of {} bytes (limit {MAX_ID_LEN})", name.len()),
            ));
        }
        for i in 0..n {
            let (bl, kv) = (self.block_lens[i], self.kv_block_lens[i]);
            if !(1..=MAX_BLOCK_LEN).contains(&bl) {
                return Err(invalid(
                    "block_lens",
                    format!("region {i}: {bl} is not in 1..={MAX_BLOCK_LEN}"),
                ));
            }
            if kv == 0 || kv > bl {
                return Err(invalid(
                    "kv_block_lens",
                    format!("region {i}: {kv} is not in 1..=block_len {bl}"),
                ));
            }
        }
        Ok(n)
    }

    /// The requests and their destination blocks, against this worker's
    /// bounds `b` and the `n` regions' address space.
    fn validate_requests(&self, b: &PullBounds, n: usize) -> Result<(), ConnectorError> {
        if self.req_blocks.len() > MAX_REQS_PER_PULL {
            return Err(invalid(
                "req_blocks",
                format!(
                    "{} requests (limit {MAX_REQS_PER_PULL})",
                    self.req_blocks.len()
                ),
            ));
        }
        let groups = b.num_groups.max(1);
        let mut per_group = vec![0u64; groups];
        let mut max_id = 0u64;
        let mut transfer_ids = std::collections::HashSet::new();
        for (d_req_id, (transfer_id, blocks)) in &self.req_blocks {
            check_id("req_blocks (request id)", d_req_id)?;
            check_id("req_blocks (transfer id)", transfer_id)?;
            if !transfer_ids.insert(transfer_id.as_str()) {
                return Err(invalid(
                    "req_blocks",
                    format!("transfer id {:?} appears twice", truncate(transfer_id)),
                ));
            }
            if blocks.len() > groups.min(MAX_GROUPS) {
                return Err(invalid(
                    "req_blocks",
                    format!(
                        "request {:?} names {} KV-cache groups; this worker has {groups}",
                        truncate(d_req_id),
                        blocks.len()
                    ),
                ));
            }
            for (g, ids) in blocks.iter().enumerate() {
                per_group[g] += ids.len() as u64;
                if per_group[g] > b.num_blocks {
                    return Err(invalid(
                        "req_blocks",
                        format!(
                            "more than {} block ids in group {g} (this worker's block count)",
                            b.num_blocks
                        ),
                    ));
                }
                max_id = ids.iter().copied().fold(max_id, u64::max);
            }
        }
        // Every destination block must lie inside the address space.
        for i in 0..n {
            let end = max_id
                .checked_add(1)
                .and_then(|x| x.checked_mul(self.block_lens[i]))
                .and_then(|x| x.checked_add(self.kv_caches_base_addr[i]));
            if end.is_none() {
                return Err(invalid(
                    "req_blocks",
                    format!("block id {max_id} overflows region {i}'s addresses"),
                ));
            }
        }
        Ok(())
    }
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// `MooncakeXferResponse.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XferStatus {
    /// 0: this was the last reply for the message.
    Finish,
    /// 1: more replies for this message follow.
    Continue,
    /// 2: every request of the message failed.
    Error,
}

impl Serialize for XferStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(match self {
            Self::Finish => 0,
            Self::Continue => 1,
            Self::Error => 2,
        })
    }
}

impl<'de> Deserialize<'de> for XferStatus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match i64::deserialize(d)? {
            0 => Ok(Self::Finish),
            1 => Ok(Self::Continue),
            2 => Ok(Self::Error),
            other => Err(serde::de::Error::custom(format!("unknown status {other}"))),
        }
    }
}

/// Prefiller → decoder: the outcome of (part of) a pull.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XferResponse {
    /// FINISH, CONTINUE or ERROR.
    pub status: XferStatus,
    /// Requests written successfully in this reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok_reqs: Option<Vec<String>>,
    /// Requests that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub err_reqs: Option<Vec<String>>,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub err_msg: Option<String>,
}

impl XferResponse {
    /// An ERROR reply.
    pub fn error(msg: impl Into<String>) -> Self {
        Self {
            status: XferStatus::Error,
            ok_reqs: None,
            err_reqs: None,
            err_msg: Some(msg.into()),
        }
    }
}

/// Encodes a message as a msgpack map with field names.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(msg).expect("side-channel messages always encode")
}

/// Decodes a msgpack message, naming what was expected on failure.
pub fn decode<'a, T: Deserialize<'a>>(what: &str, bytes: &'a [u8]) -> Result<T, ConnectorError> {
    rmp_serde::from_slice(bytes).map_err(|e| {
        ConnectorError::new(
            ConnectorErrorCode::Protocol,
            format!("cannot decode a {what} ({} bytes): {e}", bytes.len()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> XferMetadata {
        let mut req_blocks = BTreeMap::new();
        req_blocks.insert(
            "cmpl-1-0".to_string(),
            ("xfer-abc".to_string(), vec![vec![3, 4, 5]]),
        );
        XferMetadata {
            remote_hostname: "127.0.0.1".into(),
            remote_port: 16001,
            remote_tp_size: 1,
            remote_tp_rank: 0,
            req_blocks,
            kv_caches_base_addr: vec![140_000_000_000_000],
            block_lens: vec![8192],
            kv_block_lens: vec![8192],
            registered_layer_names: vec!["model.layers.0.self_attn.attn".into()],
            registered_layer_indices: vec![0],
            registered_group_indices: vec![0],
            remote_pp_size: 1,
        }
    }

    #[test]
    fn metadata_is_an_11_entry_map_without_defaults() {
        let bytes = encode(&sample());
        // fixmap with 11 entries: remote_pp_size (default 1) is left out.
        assert_eq!(bytes[0], 0x80 | 11);
        let back: XferMetadata = decode("metadata", &bytes).unwrap();
        assert_eq!(back, sample());
        // A large base address travels as uint64.
        assert!(bytes.windows(9).any(|w| w[0] == 0xcf));
    }

    #[test]
    fn response_shapes() {
        let r = XferResponse {
            status: XferStatus::Finish,
            ok_reqs: Some(vec!["a".into()]),
            err_reqs: None,
            err_msg: None,
        };
        let bytes = encode(&r);
        assert_eq!(bytes[0], 0x80 | 2);
        assert_eq!(decode::<XferResponse>("response", &bytes).unwrap(), r);
        let e = XferResponse::error("D tp_rank 3 is not paired with P tp_rank 0");
        assert_eq!(
            decode::<XferResponse>("response", &encode(&e))
                .unwrap()
                .status,
            XferStatus::Error
        );
    }

    #[test]
    fn unknown_keys_ignored_and_missing_defaults_filled() {
        // {status: 1, extra: true}
        let bytes = [
            0x82, 0xa6, b's', b't', b'a', b't', b'u', b's', 0x01, 0xa5, b'e', b'x', b't', b'r',
            b'a', 0xc3,
        ];
        let r: XferResponse = decode("response", &bytes).unwrap();
        assert_eq!(r.status, XferStatus::Continue);
        assert!(r.ok_reqs.is_none());
        assert!(decode::<XferResponse>("response", &[0xc1]).is_err());
        assert!(decode::<XferMetadata>("metadata", &encode(&r))
            .unwrap_err()
            .to_string()
            .contains("metadata"));
    }
}
