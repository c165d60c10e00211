//! The key-value store behind the metadata server: keys as the server
//! receives them (decoded, surrounding whitespace stripped), values stored
//! byte for byte as sent, and caps on how much it holds.

use std::collections::HashMap;

use bytes::Bytes;

/// How much one store may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most keys held at once.
    pub max_keys: usize,
    /// The most bytes held at once, keys and values together.
    pub max_total_bytes: usize,
    /// The longest key accepted, in bytes (after decoding and stripping).
    pub max_key_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_keys: 64 * 1024,
            max_total_bytes: 1 << 30,
            max_key_bytes: 4096,
        }
    }
}

/// Why a PUT was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutError {
    /// The key names an `rpc_meta` entry that already exists, and
    /// overwriting those is not allowed (upstream's rule).
    DuplicateRpcMeta,
    /// The key is longer than [`Limits::max_key_bytes`].
    KeyTooLong {
        /// The key's length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A new key would exceed [`Limits::max_keys`].
    TooManyKeys {
        /// The limit.
        max: usize,
    },
    /// The store would hold more than [`Limits::max_total_bytes`].
    TooManyBytes {
        /// What the store would hold with this entry.
        would_hold: usize,
        /// The limit.
        max: usize,
    },
}

impl std::fmt::Display for PutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // Upstream's exact answer text.
            Self::DuplicateRpcMeta => f.write_str("Duplicate rpc_meta key not allowed"),
            Self::KeyTooLong { len, max } => {
                write!(f, "metadata key too long: {len} bytes (limit {max})")
            }
            Self::TooManyKeys { max } => {
                write!(f, "metadata store full: key limit ({max}) reached")
            }
            Self::TooManyBytes { would_hold, max } => write!(
                f,
                "metadata store full: would hold {would_hold} bytes (limit {max})"
            ),
        }
    }
}

impl std::error::Error for PutError {}

/// Whitespace as Python's `str.strip()` sees it (`str.isspace`): Unicode
/// White_Space plus the separators U+001C..U+001F.
pub fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `key` without surrounding whitespace, as upstream's server strips it.
pub fn strip_key(key: &str) -> &str {
    key.trim_matches(is_python_space)
}

/// The metadata entries, with their caps.
#[derive(Debug, Default)]
pub struct Store {
    map: HashMap<String, Bytes>,
    bytes: usize,
    limits: Limits,
    allow_rpc_meta_overwrite: bool,
}

impl Store {
    /// An empty store with these caps. With `allow_rpc_meta_overwrite`, a
    /// PUT may replace an existing `rpc_meta` key (upstream refuses that).
    pub fn new(limits: Limits, allow_rpc_meta_overwrite: bool) -> Self {
        Self {
            map: HashMap::new(),
            bytes: 0,
            limits,
            allow_rpc_meta_overwrite,
        }
    }

    /// The caps this store enforces.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The value stored under `key`.
    pub fn get(&self, key: &str) -> Option<Bytes> {
        self.map.get(key).cloned()
    }

    /// Stores `value` under `key`, replacing what was there (but see
    /// [`PutError::DuplicateRpcMeta`]).
    pub fn put(&mut self, key: &str, value: Bytes) -> Result<(), PutError> {
        let max = self.limits.max_key_bytes;
        if key.len() > max {
            return Err(PutError::KeyTooLong {
                len: key.len(),
                max,
            });
        }
        let old = self.map.get(key).map(|v| v.len());
        if old.is_some() && key.contains("rpc_meta") && !self.allow_rpc_meta_overwrite {
            return Err(PutError::DuplicateRpcMeta);
        }
        if old.is_none() && self.map.len() >= self.limits.max_keys {
            return Err(PutError::TooManyKeys {
                max: self.limits.max_keys,
            });
        }
        let freed = old.map_or(0, |v| key.len() + v);
        let would_hold = (self.bytes - freed)
            .saturating_add(key.len())
            .saturating_add(value.len());
        if would_hold > self.limits.max_total_bytes {
            return Err(PutError::TooManyBytes {
                would_hold,
                max: self.limits.max_total_bytes,
            });
        }
        self.bytes = would_hold;
        self.map.insert(key.to_owned(), value);
        Ok(())
    }

    /// Removes `key`; false when it was not there.
    pub fn delete(&mut self, key: &str) -> bool {
        match self.map.remove(key) {
            Some(v) => {
                self.bytes -= key.len() + v.len();
                true
            }
            None => false,
        }
    }

    /// How many keys the store holds.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The bytes held, keys and values together.
    pub fn total_bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Limits {
        Limits {
            max_keys: 3,
            max_total_bytes: 40,
            max_key_bytes: 16,
        }
    }

    #[test]
    fn put_get_delete() {
        let mut s = Store::new(Limits::default(), false);
        assert_eq!(s.get("a"), None);
        s.put("a", Bytes::from_static(b"{}")).unwrap();
        assert_eq!(s.get("a").as_deref(), Some(&b"{}"[..]));
        s.put("a", Bytes::from_static(b"[1]")).unwrap();
        assert_eq!(s.get("a").as_deref(), Some(&b"[1]"[..]));
        assert_eq!((s.len(), s.total_bytes()), (1, 4));
        assert!(s.delete("a"));
        assert!(!s.delete("a"));
        assert!(s.is_empty());
        assert_eq!(s.total_bytes(), 0);
    }

    #[test]
    fn rpc_meta_rule_both_ways() {
        let mut s = Store::new(Limits::default(), false);
        s.put("mooncake/rpc_meta/x", Bytes::from_static(b"1"))
            .unwrap();
        assert_eq!(
            s.put("mooncake/rpc_meta/x", Bytes::from_static(b"1")),
            Err(PutError::DuplicateRpcMeta)
        );
        assert_eq!(s.get("mooncake/rpc_meta/x").as_deref(), Some(&b"1"[..]));
        // Any key containing rpc_meta, as upstream matches it.
        s.put("xrpc_metay", Bytes::new()).unwrap();
        assert!(s.put("xrpc_metay", Bytes::new()).is_err());
        // Other keys overwrite freely.
        s.put("mooncake/ram/x", Bytes::new()).unwrap();
        s.put("mooncake/ram/x", Bytes::new()).unwrap();

        let mut s = Store::new(Limits::default(), true);
        s.put("mooncake/rpc_meta/x", Bytes::from_static(b"1"))
            .unwrap();
        s.put("mooncake/rpc_meta/x", Bytes::from_static(b"22"))
            .unwrap();
        assert_eq!(s.get("mooncake/rpc_meta/x").as_deref(), Some(&b"22"[..]));
        assert_eq!(s.total_bytes(), "mooncake/rpc_meta/x".len() + 2);
    }

    #[test]
    fn caps() {
        let mut s = Store::new(small(), false);
        let long = "k".repeat(17);
        assert_eq!(
            s.put(&long, Bytes::new()),
            Err(PutError::KeyTooLong { len: 17, max: 16 })
        );
        s.put("a", Bytes::new()).unwrap();
        s.put("b", Bytes::new()).unwrap();
        s.put("c", Bytes::new()).unwrap();
        assert_eq!(
            s.put("d", Bytes::new()),
            Err(PutError::TooManyKeys { max: 3 })
        );
        // Replacing an existing key is no new key.
        s.put("c", Bytes::from(vec![0u8; 30])).unwrap();
        assert_eq!(s.total_bytes(), 33);
        assert!(matches!(
            s.put("b", Bytes::from(vec![0u8; 8])),
            Err(PutError::TooManyBytes {
                would_hold: 41,
                max: 40
            })
        ));
        // A refused PUT changes nothing.
        assert_eq!(s.get("b").as_deref(), Some(&b""[..]));
        assert_eq!(s.total_bytes(), 33);
        s.put("b", Bytes::from(vec![0u8; 7])).unwrap();
        assert_eq!(s.total_bytes(), 40);
        // Shrinking the big value frees room.
        s.put("c", Bytes::new()).unwrap();
        assert!(s.delete("a"));
        s.put("d", Bytes::from(vec![0u8; 20])).unwrap();
        assert_eq!(s.total_bytes(), 8 + 1 + 21);
    }

    #[test]
    fn strips_python_whitespace() {
        assert_eq!(strip_key("  a b\t\n"), "a b");
        assert_eq!(strip_key("\u{1c}\u{a0}k\u{3000}\u{1f}"), "k");
        assert_eq!(strip_key("\u{200b}k"), "\u{200b}k");
        assert_eq!(strip_key(" \t "), "");
    }
}
