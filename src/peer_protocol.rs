//! The line protocol of the peer tools: `mooncake-peer` (our engine) and
//! `tests/interop/upstream_peer.py` (the upstream engine) speak it alike, so
//! tests drive either one the same way, in separate processes.
//!
//! A peer starts one engine on 127.0.0.1, registers one remote-accessible
//! buffer of `--size` bytes filled with pattern `--seed`
//! ([`crate::testkit`]), prints
//!
//! ```text
//! READY {"segment":"127.0.0.1:16001","addr":140300000000000,"len":1048576}
//! ```
//!
//! and then answers one line per command with `OK [detail]` or
//! `ERR <reason>`:
//!
//! | command | effect |
//! |---|---|
//! | `read SEG RADDR LOFF LEN` | one READ of `LEN` bytes at `RADDR` of segment `SEG` into the local buffer at `LOFF` |
//! | `write SEG RADDR LOFF LEN` | one WRITE from the local buffer at `LOFF` |
//! | `readv SEG RADDR LOFF BLOCK COUNT` | one batch of `COUNT` READs; request `i` moves `BLOCK` bytes from `RADDR + i*BLOCK` to `LOFF + i*BLOCK` |
//! | `writev SEG RADDR LOFF BLOCK COUNT` | the same with WRITEs |
//! | `write_notify SEG RADDR LOFF LEN NAME MSG` | a WRITE whose completion sends notification `(NAME, MSG)` |
//! | `probe SEG` | a handshake probe |
//! | `fill OFF LEN SEED` | local bytes `OFF..OFF+LEN` := pattern `SEED` at the same positions |
//! | `check OFF LEN SEED START` | local byte `OFF+i` == pattern `SEED` at `START+i`, for every `i` |
//! | `notifs` | `OK [["name","msg"],...]`: drains received notifications |
//! | `quit` | exits |

/// One parsed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `read` / `write` / `readv` / `writev` / `write_notify`.
    Transfer {
        /// true for WRITE.
        write: bool,
        /// Target segment name.
        segment: String,
        /// Remote start address.
        remote_addr: u64,
        /// Local start offset.
        local_offset: usize,
        /// Bytes per request.
        block: usize,
        /// Number of requests.
        count: usize,
        /// Notification sent after completion.
        notify: Option<(String, String)>,
    },
    /// `probe SEG`.
    Probe(String),
    /// `fill OFF LEN SEED`.
    Fill {
        /// Offset.
        offset: usize,
        /// Length.
        len: usize,
        /// Pattern seed.
        seed: u64,
    },
    /// `check OFF LEN SEED START`.
    Check {
        /// Offset.
        offset: usize,
        /// Length.
        len: usize,
        /// Pattern seed.
        seed: u64,
        /// Pattern position of byte `offset`.
        start: usize,
    },
    /// `notifs`.
    Notifications,
    /// `quit`.
    Quit,
}

fn num<T: std::str::FromStr>(tok: Option<&str>, what: &str) -> Result<T, String> {
    tok.ok_or_else(|| format!("missing {what}"))?
        .parse()
        .map_err(|_| format!("bad {what}"))
}

impl Command {
    /// Parses one line.
    pub fn parse(line: &str) -> Result<Self, String> {
        let mut t = line.split_whitespace();
        let verb = t.next().ok_or("empty command")?;
        let transfer =
            |t: &mut std::str::SplitWhitespace<'_>, write: bool, vector: bool, notify: bool| {
                let segment = t.next().ok_or("missing segment")?.to_string();
                let remote_addr = num(t.next(), "remote address")?;
                let local_offset = num(t.next(), "local offset")?;
                let block = num(t.next(), "length")?;
                let count = if vector { num(t.next(), "count")? } else { 1 };
                let notify = if notify {
                    Some((
                        t.next().ok_or("missing notify name")?.to_string(),
                        t.next().ok_or("missing notify message")?.to_string(),
                    ))
                } else {
                    None
                };
                Ok::<_, String>(Command::Transfer {
                    write,
                    segment,
                    remote_addr,
                    local_offset,
                    block,
                    count,
                    notify,
                })
            };
        let cmd = match verb {
            "read" => transfer(&mut t, false, false, false)?,
            "write" => transfer(&mut t, true, false, false)?,
            "readv" => transfer(&mut t, false, true, false)?,
            "writev" => transfer(&mut t, true, true, false)?,
            "write_notify" => transfer(&mut t, true, false, true)?,
            "probe" => Command::Probe(t.next().ok_or("missing segment")?.to_string()),
            "fill" => Command::Fill {
                offset: num(t.next(), "offset")?,
                len: num(t.next(), "length")?,
                seed: num(t.next(), "seed")?,
            },
            "check" => Command::Check {
                offset: num(t.next(), "offset")?,
                len: num(t.next(), "length")?,
                seed: num(t.next(), "seed")?,
                start: num(t.next(), "start")?,
            },
            "notifs" => Command::Notifications,
            "quit" => Command::Quit,
            other => return Err(format!("unknown command {other:?}")),
        };
        Ok(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_command() {
        assert_eq!(
            Command::parse("readv 127.0.0.1:1 4096 0 512 8").unwrap(),
            Command::Transfer {
                write: false,
                segment: "127.0.0.1:1".into(),
                remote_addr: 4096,
                local_offset: 0,
                block: 512,
                count: 8,
                notify: None
            }
        );
        assert!(matches!(
            Command::parse("write_notify s 1 2 3 n m").unwrap(),
            Command::Transfer {
                write: true,
                notify: Some(_),
                ..
            }
        ));
        assert_eq!(
            Command::parse("check 0 10 1 5").unwrap(),
            Command::Check {
                offset: 0,
                len: 10,
                seed: 1,
                start: 5
            }
        );
        assert!(Command::parse("read s x 0 1").is_err());
        assert!(Command::parse("bogus").is_err());
    }
}
