//! The connector's configuration: vLLM's `--kv-transfer-config` JSON and
//! the `VLLM_MOONCAKE_*` environment variables, with vLLM's names, types and
//! defaults. Every bad value is an error naming its key.
use std::net::IpAddr;
use std::time::Duration;

use mooncake::Metadata;
use serde_json::Value;

use super::error::ConnectorError;

/// `kv_role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvRole {
    /// A prefiller: computes KV and sends it.
    Producer,
    /// A decoder: receives KV.
    Consumer,
    /// Both in one engine.
    Both,
}

impl KvRole {
    /// Whether this role sends KV (runs the producer and the bootstrap server).
    pub fn is_producer(self) -> bool {
        matches!(self, Self::Producer | Self::Both)
    }
    /// Whether this role receives KV.
    pub fn is_consumer(self) -> bool {
        matches!(self, Self::Consumer | Self::Both)
    }
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Producer => "kv_producer",
            Self::Consumer => "kv_consumer",
            Self::Both => "kv_both",
        }
    }
}

/// What a decoder does when KV could not be loaded (`kv_load_failure_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadFailurePolicy {
    /// Fail the request.
    Fail,
    /// Recompute the prompt locally.
    Recompute,
}

/// `mooncake_protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MooncakeProtocol {
    /// RDMA when usable, else TCP (upstream's auto-discovery).
    Rdma,
    /// TCP.
    Tcp,
}

/// An external bootstrap server (`bootstrap_server_address`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// Host name or address.
    pub host: String,
    /// Port (1..=65535).
    pub port: u16,
}

impl HostPort {
    /// Parses `"host:port"` with vLLM's rule: non-empty host, port 1..65535.
    pub fn parse(key: &str, s: &str) -> Result<Self, ConnectorError> {
        let bad =
            |why: &str| ConnectorError::config(key, format!("{s:?} is not \"host:port\" ({why})"));
        let (host, port) = s.rsplit_once(':').ok_or_else(|| bad("no ':'"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        let port: u32 = port.parse().map_err(|_| bad("the port is not a number"))?;
        if !(1..=65535).contains(&port) {
            return Err(bad("the port must be in 1..65535"));
        }
        Ok(Self {
            host: host.to_string(),
            port: port as u16,
        })
    }

    /// `http://host:port`.
    pub fn url(&self) -> String {
        if self.host.contains(':') {
            format!("http://[{}]:{}", self.host, self.port)
        } else {
            format!("http://{}:{}", self.host, self.port)
        }
    }
}

/// The parsed `--kv-transfer-config`.
#[derive(Debug, Clone, PartialEq)]
pub struct KvTransferConfig {
    /// `kv_connector` (must be `"MooncakeConnector"`).
    pub kv_connector: String,
    /// `kv_role`.
    pub kv_role: KvRole,
    /// `engine_id`; a random UUID when absent.
    pub engine_id: String,
    /// `kv_load_failure_policy` (default `fail`).
    pub kv_load_failure_policy: LoadFailurePolicy,
    /// `kv_connector_extra_config.num_workers` (default 10).
    pub num_workers: usize,
    /// `kv_connector_extra_config.mooncake_protocol` (default `rdma`).
    pub mooncake_protocol: MooncakeProtocol,
    /// `kv_connector_extra_config.device_name`: the NIC allow-list handed to
    /// the engine (comma-separated; default empty = all).
    pub device_name: Vec<String>,
    /// `kv_connector_extra_config.bootstrap_server_address`: an external
    /// bootstrap server; when set, no embedded server is started.
    pub bootstrap_server_address: Option<HostPort>,
    /// `kv_connector_extra_config.metadata_server`: where the transfer
    /// engines publish and find each other (default `"P2PHANDSHAKE"`, as
    /// vLLM's connector; `etcd://...`, `redis://...` or `http://...` select
    /// a metadata store, with the same key name as Mooncake Store's
    /// `mooncake.json`). Every prefill and decode worker must name the same
    /// store.
    pub metadata_server: Metadata,
}

fn get_str<'a>(
    obj: &'a serde_json::Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'a str>, ConnectorError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ConnectorError::config(
            path,
            format!("expected a string, got {other}"),
        )),
    }
}

impl KvTransferConfig {
    /// Parses the JSON text of `--kv-transfer-config`.
    pub fn from_json(text: &str) -> Result<Self, ConnectorError> {
        let v: Value = serde_json::from_str(text).map_err(|e| {
            ConnectorError::config("kv_transfer_config", format!("not valid JSON: {e}"))
        })?;
        Self::from_value(&v)
    }

    /// Parses an already decoded JSON value.
    pub fn from_value(v: &Value) -> Result<Self, ConnectorError> {
        let obj = v.as_object().ok_or_else(|| {
            ConnectorError::config("kv_transfer_config", "expected a JSON object")
        })?;
        let kv_connector = parse_kv_connector(obj)?;
        let kv_role = parse_kv_role(obj)?;
        let engine_id = parse_engine_id(obj)?;
        let kv_load_failure_policy = parse_load_failure_policy(obj)?;
        let empty = serde_json::Map::new();
        let extra = extra_config(obj)?.unwrap_or(&empty);
        Ok(Self {
            kv_connector,
            kv_role,
            engine_id,
            kv_load_failure_policy,
            num_workers: parse_num_workers(extra)?,
            mooncake_protocol: parse_mooncake_protocol(extra)?,
            device_name: parse_device_name(extra)?,
            bootstrap_server_address: parse_bootstrap_server_address(extra)?,
            metadata_server: parse_metadata_server(extra)?,
        })
    }
}

type JsonObject = serde_json::Map<String, Value>;

/// `kv_connector`: required, and must be `"MooncakeConnector"`.
fn parse_kv_connector(obj: &JsonObject) -> Result<String, ConnectorError> {
    let kv_connector = get_str(obj, "kv_connector", "kv_connector")?
        .ok_or_else(|| {
            ConnectorError::config("kv_connector", "missing (expected \"MooncakeConnector\")")
        })?
        .to_string();
    if kv_connector != "MooncakeConnector" {
        return Err(ConnectorError::config(
            "kv_connector",
            format!("{kv_connector:?} is not supported by this connector (expected \"MooncakeConnector\")"),
        ));
    }
    Ok(kv_connector)
}

/// `kv_role`: required.
fn parse_kv_role(obj: &JsonObject) -> Result<KvRole, ConnectorError> {
    match get_str(obj, "kv_role", "kv_role")? {
        Some("kv_producer") => Ok(KvRole::Producer),
        Some("kv_consumer") => Ok(KvRole::Consumer),
        Some("kv_both") => Ok(KvRole::Both),
        Some(other) => Err(ConnectorError::config(
            "kv_role",
            format!("{other:?} is not one of kv_producer, kv_consumer, kv_both"),
        )),
        None => Err(ConnectorError::config(
            "kv_role",
            "missing (kv_producer, kv_consumer or kv_both)",
        )),
    }
}

/// `engine_id`: non-empty; a random UUID when absent.
fn parse_engine_id(obj: &JsonObject) -> Result<String, ConnectorError> {
    match get_str(obj, "engine_id", "engine_id")? {
        Some("") => Err(ConnectorError::config("engine_id", "must not be empty")),
        Some(s) => Ok(s.to_string()),
        None => Ok(uuid::Uuid::new_v4().to_string()),
    }
}

/// `kv_load_failure_policy`: `fail` (default) or `recompute`.
fn parse_load_failure_policy(obj: &JsonObject) -> Result<LoadFailurePolicy, ConnectorError> {
    match get_str(obj, "kv_load_failure_policy", "kv_load_failure_policy")? {
        None | Some("fail") => Ok(LoadFailurePolicy::Fail),
        Some("recompute") => Ok(LoadFailurePolicy::Recompute),
        Some(other) => Err(ConnectorError::config(
            "kv_load_failure_policy",
            format!("{other:?} is not one of fail, recompute"),
        )),
    }
}

/// `kv_connector_extra_config`: an object, or `None` when absent or null.
fn extra_config(obj: &JsonObject) -> Result<Option<&JsonObject>, ConnectorError> {
    match obj.get("kv_connector_extra_config") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(other) => Err(ConnectorError::config(
            "kv_connector_extra_config",
            format!("expected a JSON object, got {other}"),
        )),
    }
}

/// `kv_connector_extra_config.num_workers`: 1..1024, default 10.
fn parse_num_workers(extra: &JsonObject) -> Result<usize, ConnectorError> {
    match extra.get("num_workers") {
        None | Some(Value::Null) => Ok(10),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(k) if (1..=1024).contains(&k) => Ok(k as usize),
            _ => Err(ConnectorError::config(
                "kv_connector_extra_config.num_workers",
                format!("{n} is not an integer in 1..1024"),
            )),
        },
        Some(other) => Err(ConnectorError::config(
            "kv_connector_extra_config.num_workers",
            format!("expected an integer, got {other}"),
        )),
    }
}

/// `kv_connector_extra_config.mooncake_protocol`: `rdma` (default) or `tcp`.
fn parse_mooncake_protocol(extra: &JsonObject) -> Result<MooncakeProtocol, ConnectorError> {
    match get_str(
        extra,
        "mooncake_protocol",
        "kv_connector_extra_config.mooncake_protocol",
    )? {
        None | Some("rdma") => Ok(MooncakeProtocol::Rdma),
        Some("tcp") => Ok(MooncakeProtocol::Tcp),
        Some(other) => Err(ConnectorError::config(
            "kv_connector_extra_config.mooncake_protocol",
            format!("{other:?} is not one of rdma, tcp"),
        )),
    }
}

/// `kv_connector_extra_config.device_name`: comma-separated, trimmed,
/// empties dropped.
fn parse_device_name(extra: &JsonObject) -> Result<Vec<String>, ConnectorError> {
    Ok(get_str(
        extra,
        "device_name",
        "kv_connector_extra_config.device_name",
    )?
    .map(|s| {
        s.split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(str::to_string)
            .collect()
    })
    .unwrap_or_default())
}

/// `kv_connector_extra_config.bootstrap_server_address`: `"host:port"`.
fn parse_bootstrap_server_address(extra: &JsonObject) -> Result<Option<HostPort>, ConnectorError> {
    const KEY: &str = "kv_connector_extra_config.bootstrap_server_address";
    get_str(extra, "bootstrap_server_address", KEY)?
        .map(|s| HostPort::parse(KEY, s))
        .transpose()
}

/// `kv_connector_extra_config.metadata_server`: a metadata connection
/// string (`P2PHANDSHAKE`, the default, or a store).
fn parse_metadata_server(extra: &JsonObject) -> Result<Metadata, ConnectorError> {
    const KEY: &str = "kv_connector_extra_config.metadata_server";
    match get_str(extra, "metadata_server", KEY)? {
        None => Ok(Metadata::P2pHandshake),
        Some(s) => s
            .parse::<Metadata>()
            .map_err(|e| ConnectorError::config(KEY, e.to_string())),
    }
}

/// The `VLLM_MOONCAKE_*` and `VLLM_HOST_IP` environment variables.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectorEnv {
    /// `VLLM_MOONCAKE_BOOTSTRAP_PORT` (int, default 8998).
    pub bootstrap_port: u16,
    /// `VLLM_MOONCAKE_CONNECTOR_TIMEOUT` (float seconds, default 30): each
    /// bootstrap HTTP call.
    pub connector_timeout: Duration,
    /// `VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT` (int seconds, default 480).
    pub abort_request_timeout: Duration,
    /// `VLLM_HOST_IP`: the address advertised to peers (default: the first
    /// non-loopback IPv4 address of an interface that is up, else 127.0.0.1).
    pub host_ip: String,
    /// `MOONCAKE_SIDE_CHANNEL_MAX_MESSAGE` (bytes, default 16 MiB): the
    /// largest side-channel message a peer may send; a peer announcing a
    /// bigger frame is dropped before anything is allocated.
    pub side_channel_max_message: u64,
    /// `MOONCAKE_UNKNOWN_TRANSFER_WAIT` (float seconds, default 5): how long
    /// a pull for a transfer id this prefiller has never seen waits for the
    /// prefill request to show up before it is answered with an error.
    pub unknown_transfer_wait: Duration,
    /// `MOONCAKE_BOOTSTRAP_QUERY_TIMEOUT` (float seconds, default 10): the
    /// total time a decoder spends on one bootstrap lookup, retries
    /// included.
    pub bootstrap_query_timeout: Duration,
    /// `MOONCAKE_BOOTSTRAP_TOKEN` (unset by default): a shared secret the
    /// bootstrap server requires on `POST /register` (`Authorization:
    /// Bearer <token>`) and our registration client sends.
    pub bootstrap_token: Option<String>,
    /// `VLLM_PP_LAYER_PARTITION` (unset by default): layers per PP stage,
    /// comma-separated, as vLLM reads it; unset, layers split evenly.
    pub pp_layer_partition: Option<Vec<usize>>,
}

impl Default for ConnectorEnv {
    fn default() -> Self {
        Self {
            bootstrap_port: 8998,
            connector_timeout: Duration::from_secs(30),
            abort_request_timeout: Duration::from_secs(480),
            host_ip: "127.0.0.1".into(),
            side_channel_max_message: super::zmtp_guard::DEFAULT_MAX_MESSAGE,
            unknown_transfer_wait: Duration::from_secs(5),
            bootstrap_query_timeout: Duration::from_secs(10),
            bootstrap_token: None,
            pp_layer_partition: None,
        }
    }
}

/// The process environment: the one place in this package that reads it
/// (`tests/knob_table.rs` checks that). Every variable is named in this file
/// and listed in README's "Environment variables" table.
fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `MOONCAKE_BOOTSTRAP_TOKEN` through `get`; empty means unset.
fn bootstrap_token(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    get("MOONCAKE_BOOTSTRAP_TOKEN").filter(|t| !t.is_empty())
}

/// `MOONCAKE_BOOTSTRAP_TOKEN` from the process environment (`None` when
/// unset or empty): the registration secret the bootstrap server and
/// client use when not given one explicitly.
pub fn bootstrap_token_from_env() -> Option<String> {
    bootstrap_token(process_env)
}

/// `OPENAI_API_KEY` from the process environment: the example proxy sends
/// it as `Authorization: Bearer` to both legs of a request, as vLLM's proxy
/// does (unset: no header). Read per request.
pub fn openai_api_key_from_env() -> Option<String> {
    process_env("OPENAI_API_KEY")
}

impl ConnectorEnv {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConnectorError> {
        Self::from_lookup(process_env)
    }

    /// Reads variables through `get` (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConnectorError> {
        let mut e = Self::default();
        if let Some(v) = get("VLLM_MOONCAKE_BOOTSTRAP_PORT") {
            e.bootstrap_port = match v.trim().parse::<u32>() {
                Ok(p) if (1..=65535).contains(&p) => p as u16,
                _ => {
                    return Err(ConnectorError::config(
                        "VLLM_MOONCAKE_BOOTSTRAP_PORT",
                        format!("{v:?} is not a port (1..65535)"),
                    ))
                }
            };
        }
        if let Some(v) = get("VLLM_MOONCAKE_CONNECTOR_TIMEOUT") {
            e.connector_timeout = match v.trim().parse::<f64>() {
                Ok(s) if s.is_finite() && s > 0.0 && s < 1e7 => Duration::from_secs_f64(s),
                _ => {
                    return Err(ConnectorError::config(
                        "VLLM_MOONCAKE_CONNECTOR_TIMEOUT",
                        format!("{v:?} is not a positive number of seconds"),
                    ))
                }
            };
        }
        if let Some(v) = get("VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT") {
            e.abort_request_timeout = match v.trim().parse::<u64>() {
                Ok(s) if s > 0 => Duration::from_secs(s),
                _ => {
                    return Err(ConnectorError::config(
                        "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT",
                        format!("{v:?} is not a positive integer number of seconds"),
                    ))
                }
            };
        }
        let secs = |key: &str, v: &str| match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s < 1e7 => Ok(Duration::from_secs_f64(s)),
            _ => Err(ConnectorError::config(
                key,
                format!("{v:?} is not a positive number of seconds"),
            )),
        };
        if let Some(v) = get("MOONCAKE_SIDE_CHANNEL_MAX_MESSAGE") {
            e.side_channel_max_message = match v.trim().parse::<u64>() {
                Ok(n) if (1024..=(1 << 32)).contains(&n) => n,
                _ => {
                    return Err(ConnectorError::config(
                        "MOONCAKE_SIDE_CHANNEL_MAX_MESSAGE",
                        format!("{v:?} is not a byte count between 1 KiB and 4 GiB"),
                    ))
                }
            };
        }
        if let Some(v) = get("MOONCAKE_UNKNOWN_TRANSFER_WAIT") {
            e.unknown_transfer_wait = secs("MOONCAKE_UNKNOWN_TRANSFER_WAIT", &v)?;
        }
        if let Some(v) = get("MOONCAKE_BOOTSTRAP_QUERY_TIMEOUT") {
            e.bootstrap_query_timeout = secs("MOONCAKE_BOOTSTRAP_QUERY_TIMEOUT", &v)?;
        }
        e.bootstrap_token = bootstrap_token(&get);
        if let Some(v) = get("VLLM_PP_LAYER_PARTITION") {
            let parts: Result<Vec<usize>, _> =
                v.split(',').map(|x| x.trim().parse::<usize>()).collect();
            e.pp_layer_partition = match parts {
                Ok(p)
                    if !p.is_empty()
                        && p.len() <= 64
                        && p.iter().all(|&n| (1..=100_000).contains(&n)) =>
                {
                    Some(p)
                }
                _ => {
                    return Err(ConnectorError::config(
                        "VLLM_PP_LAYER_PARTITION",
                        format!(
                        "{v:?} is not a comma-separated list of layer counts (one per PP stage)"
                    ),
                    ))
                }
            };
        }
        e.host_ip = match get("VLLM_HOST_IP") {
            Some(ip) if !ip.trim().is_empty() => {
                let ip = ip.trim().to_string();
                if ip.parse::<IpAddr>().is_err() {
                    return Err(ConnectorError::config(
                        "VLLM_HOST_IP",
                        format!("{ip:?} is not an IP address"),
                    ));
                }
                ip
            }
            _ => detect_host_ip(),
        };
        Ok(e)
    }

    /// The decoder's side-channel receive timeout: abort timeout + 60 s.
    pub fn receive_timeout(&self) -> Duration {
        self.abort_request_timeout + Duration::from_secs(60)
    }
}

/// The first IPv4 address of an interface that is up and not loopback, found
/// without sending any packet; 127.0.0.1 when there is none.
pub fn detect_host_ip() -> String {
    if let Ok(ifs) = if_addrs::get_if_addrs() {
        for i in ifs {
            if let IpAddr::V4(v4) = i.ip() {
                if !i.is_loopback() && !v4.is_link_local() {
                    return v4.to_string();
                }
            }
        }
    }
    "127.0.0.1".to_string()
}

#[cfg(test)]
mod tests;
