//! Checks on what a registration says, before the table is touched:
//! the body parsed as vLLM's pydantic model would, ids, ranks, sizes and
//! the side-channel address.
use axum::http::StatusCode;
use serde_json::json;

use super::{ExpectedTopology, RegisterRequest, MAX_DP_RANKS, MAX_ENGINE_ID, MAX_PP, MAX_TP};

/// Why a registration was refused: the status and the detail.
pub(super) type Refusal = (StatusCode, String);

pub(super) fn bad(msg: impl Into<String>) -> Refusal {
    (StatusCode::BAD_REQUEST, msg.into())
}

/// A registration that contradicts a live entry. vLLM's bootstrap server
/// answers these with 400 too, and its workers only log the detail.
pub(super) fn conflict(msg: impl Into<String>) -> Refusal {
    (StatusCode::BAD_REQUEST, msg.into())
}

/// Checks a registration on its own: ids, address, ranks and sizes.
pub(super) fn validate(r: &RegisterRequest, e: Option<ExpectedTopology>) -> Result<(), Refusal> {
    if r.engine_id.is_empty()
        || r.engine_id.len() > MAX_ENGINE_ID
        || !r
            .engine_id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"._:-".contains(&c))
    {
        return Err(bad(format!(
            "engine_id must be 1..={MAX_ENGINE_ID} characters of [A-Za-z0-9._:-]"
        )));
    }
    parse_side_channel(&r.addr).map_err(bad)?;
    let tp_size = r.tp_size.or(e.map(|e| e.tp_size));
    let pp_size = r.pp_size.or(e.map(|e| e.pp_size));
    let dp_size = r.dp_size.or(e.map(|e| e.dp_size));
    for (what, v, max) in [
        ("tp_size", tp_size, MAX_TP),
        ("pp_size", pp_size, MAX_PP),
        ("dp_size", dp_size, MAX_DP_RANKS as u32),
    ] {
        if let Some(v) = v {
            if v == 0 || v > max {
                return Err(bad(format!("{what}={v} is not in 1..={max}")));
            }
        }
    }
    for (what, rank, size, max) in [
        ("tp_rank", r.tp_rank, tp_size, MAX_TP),
        ("pp_rank", r.pp_rank, pp_size, MAX_PP),
        ("dp_rank", r.dp_rank, dp_size, MAX_DP_RANKS as u32),
    ] {
        let limit = size.unwrap_or(max);
        if rank >= limit {
            return Err(bad(format!("{what}={rank} is outside [0, {limit})")));
        }
    }
    if let (Some(a), Some(b)) = (r.dp_size, e.map(|e| e.dp_size)) {
        if a != b {
            return Err(conflict(format!(
                "dp_size={a}, but this server serves dp_size={b}"
            )));
        }
    }
    if let (Some(a), Some(b)) = (r.tp_size, e.map(|e| e.tp_size)) {
        if a != b {
            return Err(conflict(format!(
                "tp_size={a}, but this server serves tp_size={b}"
            )));
        }
    }
    Ok(())
}

/// `tcp://host:port` with an IP address or host name and a real port.
pub fn parse_side_channel(addr: &str) -> Result<(String, u16), String> {
    let bad = || format!("addr must be tcp://<host>:<port>, got {:?}", truncate(addr));
    if addr.len() > 300 {
        return Err(bad());
    }
    let hp = addr.strip_prefix("tcp://").ok_or_else(bad)?;
    let (host, port) = hp.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0).ok_or_else(bad)?;
    let ok_host = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-')
    };
    if !ok_host {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}
/// A validation error in FastAPI's 422 shape.
fn field_error(
    kind: &str,
    loc: &[serde_json::Value],
    msg: &str,
    input: &serde_json::Value,
) -> serde_json::Value {
    let mut l = vec![json!("body")];
    l.extend_from_slice(loc);
    json!({"type": kind, "loc": l, "msg": msg, "input": input})
}

/// An int the way pydantic's lax mode takes it: a JSON integer, a float
/// with no fraction, or a string holding an integer.
fn lax_int(v: &serde_json::Value) -> Result<i64, (&'static str, &'static str)> {
    const PARSE: (&str, &str) = (
        "int_parsing",
        "Input should be a valid integer, unable to parse string as an integer",
    );
    match v {
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(i)
            } else if let Some(f) = n.as_f64() {
                if f.fract() == 0.0 && f.abs() < 9.0e15 {
                    Ok(f as i64)
                } else if f.fract() != 0.0 {
                    Err((
                        "int_from_float",
                        "Input should be a valid integer, got a number with a fractional part",
                    ))
                } else {
                    Err(PARSE)
                }
            } else {
                Err(PARSE)
            }
        }
        serde_json::Value::String(s) => s.trim().parse::<i64>().map_err(|_| PARSE),
        serde_json::Value::Bool(b) => Ok(i64::from(*b)),
        _ => Err(("int_type", "Input should be a valid integer")),
    }
}

/// A refusal of a `/register` body: the status and the JSON answer.
type Rejection = (u16, serde_json::Value);
type Json = serde_json::Value;

/// The integer fields of a `/register` body, in pydantic's order, and
/// whether each is required.
const INT_FIELDS: [(&str, bool); 6] = [
    ("dp_rank", true),
    ("tp_rank", true),
    ("pp_rank", true),
    ("tp_size", false),
    ("pp_size", false),
    ("dp_size", false),
];

/// Parses a `/register` body as vLLM's pydantic model would: Err is the
/// status and the JSON answer (422 in FastAPI's shape, or 400 for ranks and
/// sizes out of range). Every field error is collected before answering.
pub fn parse_register(body: &[u8]) -> Result<RegisterRequest, Rejection> {
    let v = decode_body(body)?;
    let Some(obj) = v.as_object() else {
        return Err((
            422,
            json!({"detail": [field_error("model_attributes_type", &[],
                "Input should be a valid dictionary or object to extract fields from", &v)]}),
        ));
    };
    let mut errors = Vec::new();
    let engine_id = string_field(obj, "engine_id", &v, &mut errors);
    let addr = string_field(obj, "addr", &v, &mut errors);
    let ints = INT_FIELDS.map(|(key, required)| int_field(obj, key, required, &v, &mut errors));
    if !errors.is_empty() {
        return Err((422, json!({ "detail": errors })));
    }
    let vals = ranks_in_range(ints)?;
    Ok(RegisterRequest {
        engine_id,
        dp_rank: vals[0].unwrap_or(0),
        tp_rank: vals[1].unwrap_or(0),
        pp_rank: vals[2].unwrap_or(0),
        addr,
        tp_size: vals[3],
        pp_size: vals[4],
        dp_size: vals[5],
    })
}

/// The body as JSON, or FastAPI's `json_invalid` answer.
fn decode_body(body: &[u8]) -> Result<Json, Rejection> {
    serde_json::from_slice(body).map_err(|e| {
        (
            422,
            json!({"detail": [{"type": "json_invalid", "loc": ["body", e.column()],
                "msg": "JSON decode error", "input": {}, "ctx": {"error": e.to_string()}}]}),
        )
    })
}

/// A required string field; a missing or non-string one adds its error
/// (the whole body `v` is the input of a "missing" error, as in pydantic).
fn string_field(
    obj: &serde_json::Map<String, Json>,
    key: &str,
    v: &Json,
    errors: &mut Vec<Json>,
) -> String {
    match obj.get(key) {
        None => {
            errors.push(field_error("missing", &[json!(key)], "Field required", v));
            String::new()
        }
        Some(Json::String(s)) => s.clone(),
        Some(other) => {
            errors.push(field_error(
                "string_type",
                &[json!(key)],
                "Input should be a valid string",
                other,
            ));
            String::new()
        }
    }
}

/// An integer field taken leniently ([`lax_int`]); `None` when an optional
/// one is absent or null, or when it adds an error.
fn int_field(
    obj: &serde_json::Map<String, Json>,
    key: &str,
    required: bool,
    v: &Json,
    errors: &mut Vec<Json>,
) -> Option<i64> {
    match obj.get(key) {
        None | Some(Json::Null) if !required => None,
        None => {
            errors.push(field_error("missing", &[json!(key)], "Field required", v));
            None
        }
        Some(x) => match lax_int(x) {
            Ok(i) => Some(i),
            Err((kind, msg)) => {
                errors.push(field_error(kind, &[json!(key)], msg, x));
                None
            }
        },
    }
}

/// The integer fields as `u32`; the first that does not fit is a 400
/// naming it.
fn ranks_in_range(ints: [Option<i64>; 6]) -> Result<[Option<u32>; 6], Rejection> {
    let mut vals = [None; 6];
    for (i, x) in ints.into_iter().enumerate() {
        vals[i] = match x {
            None => None,
            Some(n) => Some(u32::try_from(n).map_err(|_| {
                (
                    400,
                    json!({"detail": format!("{}={n} is out of range", INT_FIELDS[i].0)}),
                )
            })?),
        };
    }
    Ok(vals)
}
