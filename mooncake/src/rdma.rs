//! Typed views of the RDMA transport's state: the discovered topology
//! ([`RdmaTopology`], from [`Engine::rdma_topology`](crate::Engine::rdma_topology))
//! and the per-NIC counters ([`RdmaCounters`], from
//! [`Engine::rdma_counters`](crate::Engine::rdma_counters)).
//!
//! Both are decoded from the JSON the engine reports
//! (`mc_engine_rdma_topology` / `mc_engine_rdma_counters`). Decoding is
//! lenient where the engine may grow: unknown fields are ignored and an
//! unknown link layer becomes [`LinkLayer::Unknown`]; a missing required
//! field or a wrong type is an [`Error::Decode`].
//!
//! # Example
//!
//! ```no_run
//! use mooncake::{Engine, LinkLayer, Protocol};
//!
//! # fn main() -> mooncake::Result<()> {
//! let engine = Engine::builder()
//!     .protocol(Protocol::Rdma)
//!     .device_allow_list(["mlx5_0", "mlx5_1"])
//!     .build()?;
//! let topo = engine.rdma_topology()?;
//! for dev in &topo.devices {
//!     println!("{} {} numa {:?} gid {}", dev.name, dev.link_layer, dev.numa_node, dev.gid);
//! }
//! // The NICs that serve host memory on NUMA node 0: same-node NICs first.
//! let nics = topo.nics_for("cpu:0");
//! println!("preferred {:?}, available {:?}", nics.preferred, nics.available);
//! assert!(topo.devices.iter().all(|d| d.link_layer != LinkLayer::Unknown));
//!
//! // ... transfers ...
//! let before = engine.rdma_counters()?;
//! let after = engine.rdma_counters()?;
//! let moved = after.since(&before);
//! println!("{} bytes over RDMA", moved.total_bytes());
//! # Ok(())
//! # }
//! ```
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer};

use crate::error::{Error, Result};

/// The link layer of an RDMA port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LinkLayer {
    /// InfiniBand (the engine reports `"IB"`).
    Ib,
    /// RoCE, RDMA over Converged Ethernet (the engine reports `"RoCE"`).
    Roce,
    /// Not known (the engine reports `"unknown"`), or a name this crate
    /// does not know.
    Unknown,
}

impl LinkLayer {
    /// Parses the engine's name (`"IB"`, `"RoCE"`; also sysfs' spelling
    /// `"InfiniBand"` / `"Ethernet"`), case-insensitively; anything else is
    /// [`Unknown`](Self::Unknown).
    pub fn from_name(name: &str) -> Self {
        let n = name.trim();
        if n.eq_ignore_ascii_case("ib") || n.eq_ignore_ascii_case("infiniband") {
            Self::Ib
        } else if n.eq_ignore_ascii_case("roce") || n.eq_ignore_ascii_case("ethernet") {
            Self::Roce
        } else {
            Self::Unknown
        }
    }

    /// The engine's name: `"IB"`, `"RoCE"` or `"unknown"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ib => "IB",
            Self::Roce => "RoCE",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for LinkLayer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Self::from_name(&s))
    }
}

/// NUMA node as the engine reports it: a node number, or -1 when sysfs does
/// not say.
fn numa<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<u32>, D::Error> {
    let n = i64::deserialize(d)?;
    Ok(u32::try_from(n).ok())
}

/// One NIC (RDMA device, port `MC_IB_PORT`) the RDMA transport opened.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct RdmaDevice {
    /// Device name, e.g. `"mlx5_0"`: what `device_name` / the allow-list
    /// name.
    pub name: String,
    /// Link layer of the port.
    pub link_layer: LinkLayer,
    /// NUMA node of the NIC's PCI device; `None` when unknown.
    #[serde(deserialize_with = "numa")]
    pub numa_node: Option<u32>,
    /// Whether the port is usable now (it turns false while the port is
    /// down; transfers then avoid the NIC).
    pub usable: bool,
    /// The GID in use, as 16 colon-separated hex bytes
    /// (`"fe:80:00:...:01"`); see [`gid_bytes`](Self::gid_bytes).
    #[serde(default)]
    pub gid: String,
    /// The port's LID (non-zero on InfiniBand, 0 on RoCE).
    #[serde(default)]
    pub lid: u16,
}

impl RdmaDevice {
    /// The GID as bytes; `None` when [`gid`](Self::gid) is not 16 hex
    /// bytes.
    pub fn gid_bytes(&self) -> Option<[u8; 16]> {
        let mut out = [0u8; 16];
        let mut parts = self.gid.split(':');
        for b in &mut out {
            let p = parts.next()?;
            if p.len() != 2 {
                return None;
            }
            *b = u8::from_str_radix(p, 16).ok()?;
        }
        parts.next().is_none().then_some(out)
    }
}

/// The NICs that serve one memory location, best first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "(Vec<String>, Vec<String>)")]
pub struct NicPreference {
    /// NICs close to the location (same NUMA node, or nearest on the PCI
    /// tree for a GPU): the engine picks among these first.
    pub preferred: Vec<String>,
    /// Other NICs that can serve it, used when no preferred one is usable.
    pub available: Vec<String>,
}

impl From<(Vec<String>, Vec<String>)> for NicPreference {
    fn from((preferred, available): (Vec<String>, Vec<String>)) -> Self {
        Self {
            preferred,
            available,
        }
    }
}

impl NicPreference {
    /// Preferred NICs, then available ones.
    pub fn all(&self) -> impl Iterator<Item = &str> {
        self.preferred
            .iter()
            .chain(&self.available)
            .map(String::as_str)
    }

    /// Whether `nic` serves the location (preferred or available).
    pub fn contains(&self, nic: &str) -> bool {
        self.all().any(|n| n == nic)
    }

    fn is_empty(&self) -> bool {
        self.preferred.is_empty() && self.available.is_empty()
    }
}

/// The RDMA transport's discovered topology
/// ([`Engine::rdma_topology`](crate::Engine::rdma_topology)).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct RdmaTopology {
    /// The NICs the transport opened (after `device_name` / the allow and
    /// deny lists / `MC_TE_FILTERS`), in the engine's order.
    pub devices: Vec<RdmaDevice>,
    /// Location (`"cpu:<numa node>"`, `"cuda:<device>"`, or a key from
    /// `MC_CUSTOM_TOPO_JSON`) → the NICs that serve it: the same matrix
    /// peers receive in this engine's segment descriptor.
    #[serde(default)]
    pub priority_matrix: BTreeMap<String, NicPreference>,
}

impl RdmaTopology {
    /// Decodes the engine's topology JSON (as returned by
    /// [`Engine::rdma_topology_json`](crate::Engine::rdma_topology_json)).
    pub fn from_json(text: &str) -> Result<Self> {
        decode("RDMA topology", text)
    }

    /// The device called `name`, if the transport opened it.
    pub fn device(&self, name: &str) -> Option<&RdmaDevice> {
        self.devices.iter().find(|d| d.name == name)
    }

    /// Names of the devices, in the engine's order.
    pub fn device_names(&self) -> Vec<&str> {
        self.devices.iter().map(|d| d.name.as_str()).collect()
    }

    /// Which NICs serve memory at `location` (e.g. `"cpu:0"`, `"cuda:1"`),
    /// resolved the way the engine resolves it: the location's own entry
    /// when it lists a NIC, else the wildcard entry `"*"`, else every NIC of
    /// the matrix as preferred.
    pub fn nics_for(&self, location: &str) -> NicPreference {
        for key in [location, "*"] {
            if let Some(e) = self.priority_matrix.get(key) {
                if !e.is_empty() {
                    return e.clone();
                }
            }
        }
        let mut all: Vec<String> = Vec::new();
        for e in self.priority_matrix.values() {
            for n in e.all() {
                if !all.iter().any(|x| x == n) {
                    all.push(n.to_string());
                }
            }
        }
        NicPreference {
            preferred: all,
            available: Vec::new(),
        }
    }
}

/// Counters of one NIC since the engine started.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct NicCounters {
    /// Device name.
    pub name: String,
    /// Link layer of the port.
    pub link_layer: LinkLayer,
    /// NUMA node of the NIC; `None` when unknown.
    #[serde(deserialize_with = "numa")]
    pub numa_node: Option<u32>,
    /// Whether the port is usable now.
    pub usable: bool,
    /// RDMA READ/WRITE work requests this engine posted on the NIC as
    /// initiator (the engine's `work_requests`).
    #[serde(alias = "wrs")]
    pub work_requests: u64,
    /// Bytes of work requests that completed successfully (initiator side:
    /// a target's NICs count nothing for transfers peers make into it).
    pub bytes: u64,
    /// Work completions with an error status.
    pub errors: u64,
    /// Slices re-posted after a failure (on this NIC or another one).
    pub retries: u64,
}

/// Per-NIC counters of the RDMA transport
/// ([`Engine::rdma_counters`](crate::Engine::rdma_counters)), one entry per
/// NIC of [`RdmaTopology::devices`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct RdmaCounters {
    /// One entry per NIC, in the engine's order.
    pub nics: Vec<NicCounters>,
}

impl RdmaCounters {
    /// Decodes the engine's counters JSON (as returned by
    /// [`Engine::rdma_counters_json`](crate::Engine::rdma_counters_json)).
    pub fn from_json(text: &str) -> Result<Self> {
        decode("RDMA counters", text)
    }

    /// The counters of NIC `name`.
    pub fn nic(&self, name: &str) -> Option<&NicCounters> {
        self.nics.iter().find(|n| n.name == name)
    }

    /// Bytes moved over every NIC.
    pub fn total_bytes(&self) -> u64 {
        self.nics.iter().map(|n| n.bytes).sum()
    }

    /// Work requests posted on every NIC.
    pub fn total_work_requests(&self) -> u64 {
        self.nics.iter().map(|n| n.work_requests).sum()
    }

    /// Errors on every NIC.
    pub fn total_errors(&self) -> u64 {
        self.nics.iter().map(|n| n.errors).sum()
    }

    /// What happened between `earlier` and `self`: every counter minus its
    /// value in `earlier` (NICs absent from `earlier` count from zero).
    pub fn since(&self, earlier: &RdmaCounters) -> RdmaCounters {
        let nics = self
            .nics
            .iter()
            .map(|n| {
                let mut d = n.clone();
                if let Some(e) = earlier.nic(&n.name) {
                    d.work_requests = n.work_requests.saturating_sub(e.work_requests);
                    d.bytes = n.bytes.saturating_sub(e.bytes);
                    d.errors = n.errors.saturating_sub(e.errors);
                    d.retries = n.retries.saturating_sub(e.retries);
                }
                d
            })
            .collect();
        RdmaCounters { nics }
    }
}

fn decode<T: serde::de::DeserializeOwned>(what: &'static str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| {
        let mut excerpt: String = text.chars().take(200).collect();
        if excerpt.len() < text.len() {
            excerpt.push_str("...");
        }
        Error::Decode {
            what,
            detail: format!("{e} in {excerpt:?}"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPO: &str = r#"{"devices":[
        {"name":"mlx5_0","link_layer":"IB","numa_node":0,"usable":true,"gid":"fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01","lid":3},
        {"name":"mlx5_1","link_layer":"RoCE","numa_node":-1,"usable":false,"gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01","lid":0,"future":1}],
        "priority_matrix":{"cpu:0":[["mlx5_0"],["mlx5_1"]],"cpu:1":[[],[]]}}"#;

    #[test]
    fn topology_decodes_and_resolves_locations() {
        let t = RdmaTopology::from_json(TOPO).unwrap();
        assert_eq!(t.device_names(), ["mlx5_0", "mlx5_1"]);
        let d0 = t.device("mlx5_0").unwrap();
        assert_eq!(
            (d0.link_layer, d0.numa_node, d0.usable, d0.lid),
            (LinkLayer::Ib, Some(0), true, 3)
        );
        assert_eq!(d0.gid_bytes().unwrap()[..2], [0xfe, 0x80]);
        let d1 = t.device("mlx5_1").unwrap();
        assert_eq!((d1.link_layer, d1.numa_node), (LinkLayer::Roce, None));
        assert_eq!(d1.gid_bytes().unwrap()[10..12], [0xff, 0xff]);
        let cpu0 = t.nics_for("cpu:0");
        assert_eq!(
            (cpu0.preferred, cpu0.available),
            (vec!["mlx5_0".to_string()], vec!["mlx5_1".to_string()])
        );
        // An empty entry and an unknown location fall back to every NIC.
        for loc in ["cpu:1", "cuda:3"] {
            let p = t.nics_for(loc);
            assert_eq!(p.preferred, ["mlx5_0", "mlx5_1"], "{loc}");
            assert!(p.contains("mlx5_1") && !p.contains("mlx5_9"));
        }
    }

    #[test]
    fn link_layer_names() {
        for (s, ll) in [
            ("IB", LinkLayer::Ib),
            ("InfiniBand", LinkLayer::Ib),
            ("RoCE", LinkLayer::Roce),
            ("Ethernet", LinkLayer::Roce),
            ("unknown", LinkLayer::Unknown),
            ("iWARP", LinkLayer::Unknown),
        ] {
            assert_eq!(LinkLayer::from_name(s), ll, "{s}");
        }
        assert_eq!(LinkLayer::Roce.to_string(), "RoCE");
    }

    #[test]
    fn counters_decode_and_subtract() {
        let a = RdmaCounters::from_json(
            r#"[{"name":"sv0","link_layer":"RoCE","numa_node":0,"usable":true,"work_requests":4,"bytes":100,"errors":0,"retries":0}]"#,
        )
        .unwrap();
        let b = RdmaCounters::from_json(
            r#"[{"name":"sv0","link_layer":"RoCE","numa_node":0,"usable":true,"work_requests":10,"bytes":700,"errors":1,"retries":2},
                {"name":"sv1","link_layer":"IB","numa_node":1,"usable":true,"wrs":1,"bytes":5,"errors":0,"retries":0}]"#,
        )
        .unwrap();
        let d = b.since(&a);
        assert_eq!(d.nic("sv0").unwrap().bytes, 600);
        assert_eq!(d.nic("sv0").unwrap().work_requests, 6);
        assert_eq!(d.nic("sv1").unwrap().work_requests, 1);
        assert_eq!((d.total_bytes(), d.total_errors()), (605, 1));
        assert_eq!(b.total_work_requests(), 11);
    }

    #[test]
    fn bad_json_is_a_decode_error() {
        for text in [
            "not json",
            r#"{"devices":[{"name":"x"}]}"#,
            r#"[{"name":1}]"#,
        ] {
            let e = RdmaTopology::from_json(text)
                .err()
                .or_else(|| RdmaCounters::from_json(text).err())
                .unwrap();
            assert_eq!(e.code(), crate::ErrorCode::MalformedJson, "{e}");
        }
        let e = RdmaCounters::from_json(r#"[{"name":"sv0"}]"#).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("RDMA counters") && msg.contains("link_layer"),
            "{msg}"
        );
    }
}

/// One RDMA NIC's load (upstream's `nic_load_stat`).
#[derive(Debug, Clone, PartialEq)]
pub struct NicLoad {
    /// Device name (`mlx5_0`, ...).
    pub device: String,
    /// Bytes of work requests posted and not yet completed.
    pub inflight_bytes: u64,
    /// Moving average of the rate of completed work requests, in bytes per
    /// second (0 before the first one).
    pub ewma_bandwidth_bps: f64,
}
