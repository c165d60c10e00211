//! A bounded ZMTP 3.x front for every side-channel socket.
//!
//! The `zeromq` crate allocates whatever frame size a peer announces before
//! reading it, so a hostile peer can make it attempt a 2^62-byte allocation.
//! No libzmq-free crate enforces a maximum message size before allocating,
//! and libzmq would add a C++ dependency, so peer bytes never reach the
//! `zeromq` socket directly: a relay reads the ZMTP greeting and every frame
//! header, drops the peer at the first frame (or message, or handshake
//! command) over the limit or at any malformed header, and forwards what it
//! checked to the socket on a private loopback address. Bytes from our own
//! socket to the peer pass unchanged.
//!
//! The prefill side puts a public listener in front of its ROUTER; the
//! decode side connects each DEALER to a one-shot loopback relay that owns
//! the outgoing connection to the prefiller.
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Default largest side-channel message (all frames of one message): a pull
/// naming a few thousand requests of a few hundred blocks fits easily.
pub const DEFAULT_MAX_MESSAGE: u64 = 16 << 20;
/// Largest handshake command (READY carries the socket type and identity).
const MAX_COMMAND: u64 = 4096;
/// Largest number of frames in one message (ours have one or two).
const MAX_FRAMES: u32 = 16;
/// Connections one peer address may hold open to a prefill worker.
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;
/// Connections a prefill worker's side channel holds open in all.
pub const MAX_CONNECTIONS: usize = 1024;

/// What the relay enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest message (sum of its frames) a peer may send.
    pub max_message: u64,
    /// A connection with no bytes in either direction for this long is
    /// closed.
    pub idle: Duration,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Greeting(usize),
    Flags,
    Size {
        long: bool,
        command: bool,
        more: bool,
        got: usize,
        value: u64,
    },
    Body(u64),
}

/// Checks the byte stream a peer sends, as it arrives.
#[derive(Debug, Clone)]
pub struct FrameChecker {
    state: State,
    max_message: u64,
    msg_bytes: u64,
    msg_frames: u32,
    frame_more: bool,
    frame_command: bool,
}

impl FrameChecker {
    /// A checker at the start of a connection.
    pub fn new(max_message: u64) -> Self {
        Self {
            state: State::Greeting(0),
            max_message,
            msg_bytes: 0,
            msg_frames: 0,
            frame_more: false,
            frame_command: false,
        }
    }

    /// Checks the next bytes; Err gives how many leading bytes were fine
    /// and names the first violation.
    pub fn feed(&mut self, buf: &[u8]) -> Result<(), (usize, String)> {
        let total = buf.len();
        // Where the frame header being read began in this chunk (0: in an
        // earlier one); a bad frame is cut there.
        let mut hdr_at = 0;
        let mut rest = buf;
        self.feed_inner(&mut rest, total, &mut hdr_at)
            .map_err(|(in_greeting, why)| {
                let good = if in_greeting {
                    total - rest.len()
                } else {
                    hdr_at
                };
                (good, why)
            })
    }

    fn feed_inner(
        &mut self,
        buf: &mut &[u8],
        total: usize,
        hdr_at: &mut usize,
    ) -> Result<(), (bool, String)> {
        while !buf.is_empty() {
            let b = buf[0];
            match self.state {
                State::Greeting(pos) => {
                    // A bad greeting byte is not passed on.
                    self.greeting_byte(pos, b).map_err(|why| (true, why))?;
                    *buf = &buf[1..];
                }
                State::Flags => {
                    *hdr_at = total - buf.len();
                    *buf = &buf[1..];
                    self.flags_byte(b).map_err(|why| (false, why))?;
                }
                State::Size {
                    long,
                    command,
                    more,
                    got,
                    value,
                } => {
                    *buf = &buf[1..];
                    let value = (value << 8) | u64::from(b);
                    let need = if long { 8 } else { 1 };
                    if got + 1 < need {
                        self.state = State::Size {
                            long,
                            command,
                            more,
                            got: got + 1,
                            value,
                        };
                    } else {
                        self.start_body(value, command, more)
                            .map_err(|why| (false, why))?;
                    }
                }
                State::Body(left) => {
                    let n = (buf.len() as u64).min(left);
                    *buf = &buf[n as usize..];
                    self.state = State::Body(left - n);
                    if left == n {
                        self.end_frame();
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks byte `pos` of the 64-byte greeting: ZMTP 3 or later with the
    /// NULL mechanism.
    fn greeting_byte(&mut self, pos: usize, b: u8) -> Result<(), String> {
        let ok = match pos {
            0 => b == 0xff,
            9 => b & 1 == 1,
            10 => b >= 3,
            12..=15 => b == b"NULL"[pos - 12],
            16..=31 => b == 0,
            _ => true,
        };
        if !ok {
            return Err(format!(
                "not a ZMTP 3 greeting with the NULL mechanism (byte {pos} is {b:#04x})"
            ));
        }
        self.state = if pos + 1 == 64 {
            State::Flags
        } else {
            State::Greeting(pos + 1)
        };
        Ok(())
    }

    /// Checks the flags byte that opens a frame header.
    fn flags_byte(&mut self, f: u8) -> Result<(), String> {
        if f & !0x07 != 0 {
            return Err(format!("frame flags {f:#04x} use reserved bits"));
        }
        let (more, long, command) = (f & 1 != 0, f & 2 != 0, f & 4 != 0);
        if command && more {
            return Err("a command frame with the MORE flag".into());
        }
        self.state = State::Size {
            long,
            command,
            more,
            got: 0,
            value: 0,
        };
        Ok(())
    }

    fn start_body(&mut self, size: u64, command: bool, more: bool) -> Result<(), String> {
        if command {
            if size > MAX_COMMAND {
                return Err(format!(
                    "a {size}-byte handshake command (limit {MAX_COMMAND})"
                ));
            }
        } else {
            self.msg_frames += 1;
            if self.msg_frames > MAX_FRAMES {
                return Err(format!("a message of more than {MAX_FRAMES} frames"));
            }
            let total = self.msg_bytes.saturating_add(size);
            if total > self.max_message {
                return Err(format!(
                    "a frame of {size} bytes makes a message of {total} bytes (limit {})",
                    self.max_message
                ));
            }
            self.msg_bytes = total;
        }
        self.frame_more = more;
        self.frame_command = command;
        self.state = State::Body(size);
        if size == 0 {
            self.end_frame();
        }
        Ok(())
    }

    fn end_frame(&mut self) {
        if !self.frame_command && !self.frame_more {
            self.msg_bytes = 0;
            self.msg_frames = 0;
        }
        self.state = State::Flags;
    }
}

fn now_ms(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

/// Relays one connection until either side closes, the peer breaks a limit
/// or the connection idles out; returns why it ended. `untrusted` is the
/// remote peer, `trusted` our `zeromq` socket's end.
pub async fn relay(
    untrusted: TcpStream,
    trusted: TcpStream,
    limits: Limits,
    peer: String,
) -> String {
    let _ = untrusted.set_nodelay(true);
    let _ = trusted.set_nodelay(true);
    let (mut ur, mut uw) = untrusted.into_split();
    let (mut tr, mut tw) = trusted.into_split();
    let start = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let inbound = {
        let last = last.clone();
        let peer = peer.clone();
        async move {
            let mut checker = FrameChecker::new(limits.max_message);
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match ur.read(&mut buf).await {
                    Ok(0) => return format!("{peer} closed the connection"),
                    Err(e) => return format!("reading from {peer}: {e}"),
                    Ok(n) => n,
                };
                last.store(now_ms(start), Ordering::Relaxed);
                if let Err((good, why)) = checker.feed(&buf[..n]) {
                    // What came before the violation is passed on, so a
                    // reply already complete still arrives.
                    let _ = tw.write_all(&buf[..good]).await;
                    tracing::warn!(target: "mooncake_connector::side_channel",
                        "dropping side-channel peer {peer}: {why}");
                    return format!("dropped side-channel peer {peer}: {why}");
                }
                if tw.write_all(&buf[..n]).await.is_err() {
                    return "the local socket closed".to_string();
                }
            }
        }
    };
    let outbound = {
        let last = last.clone();
        let peer = peer.clone();
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match tr.read(&mut buf).await {
                    Ok(0) | Err(_) => return "the local socket closed".to_string(),
                    Ok(n) => n,
                };
                last.store(now_ms(start), Ordering::Relaxed);
                if uw.write_all(&buf[..n]).await.is_err() {
                    return format!("writing to {peer} failed");
                }
            }
        }
    };
    let idle = async {
        loop {
            let since = now_ms(start).saturating_sub(last.load(Ordering::Relaxed));
            let left = (limits.idle.as_millis() as u64).saturating_sub(since);
            if left == 0 {
                tracing::info!(target: "mooncake_connector::side_channel",
                    "closing side-channel connection {peer}: idle for {:?}", limits.idle);
                return format!("connection to {peer} idle for {:?}", limits.idle);
            }
            tokio::time::sleep(Duration::from_millis(left)).await;
        }
    };
    tokio::select! {
        why = inbound => why,
        why = outbound => why,
        why = idle => why,
    }
}

#[derive(Default)]
struct ConnCount {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

struct ConnSlot {
    counts: Arc<Mutex<ConnCount>>,
    ip: IpAddr,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap();
        c.total -= 1;
        if let Some(n) = c.per_peer.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.per_peer.remove(&self.ip);
            }
        }
    }
}

fn take_slot(counts: &Arc<Mutex<ConnCount>>, ip: IpAddr) -> Option<ConnSlot> {
    let mut c = counts.lock().unwrap();
    let mine = c.per_peer.get(&ip).copied().unwrap_or(0);
    if c.total >= MAX_CONNECTIONS || mine >= MAX_CONNECTIONS_PER_PEER {
        return None;
    }
    c.total += 1;
    *c.per_peer.entry(ip).or_default() += 1;
    Some(ConnSlot {
        counts: counts.clone(),
        ip,
    })
}

/// Serves the public side-channel listener: every accepted peer is relayed
/// (checked) to `backend`, our ROUTER on a loopback address. Runs until
/// aborted.
pub async fn serve_front(listener: TcpListener, backend: SocketAddr, limits: Limits) {
    let counts = Arc::new(Mutex::new(ConnCount::default()));
    loop {
        let (peer, addr) = match listener.accept().await {
            Ok(p) => p,
            Err(e) => {
                // Out of descriptors and the like: back off, keep serving.
                tracing::warn!(target: "mooncake_connector::side_channel", "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = take_slot(&counts, addr.ip()) else {
            tracing::warn!(target: "mooncake_connector::side_channel",
                "refusing side-channel peer {addr}: too many connections");
            continue;
        };
        tokio::spawn(async move {
            let _slot = slot;
            match TcpStream::connect(backend).await {
                Ok(b) => {
                    relay(peer, b, limits, addr.to_string()).await;
                }
                Err(e) => tracing::warn!(target: "mooncake_connector::side_channel",
                    "cannot reach the local side-channel socket {backend}: {e}"),
            }
        });
    }
}

/// Connects to a prefiller's side channel `tcp://host:port` (bounded by
/// `connect_timeout`) and returns a loopback endpoint for a DEALER to
/// connect to, plus the relay task (abort it when done). The relay accepts
/// one connection.
pub async fn outgoing(
    remote: &str,
    connect_timeout: Duration,
    limits: Limits,
) -> Result<(String, tokio::task::JoinHandle<String>), String> {
    let hp = remote
        .strip_prefix("tcp://")
        .ok_or_else(|| format!("{remote:?} is not a tcp:// endpoint"))?;
    let stream = match tokio::time::timeout(connect_timeout, TcpStream::connect(hp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(format!("cannot connect to {remote}: {e}")),
        Err(_) => return Err(format!("connecting to {remote} timed out")),
    };
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("cannot bind a loopback relay: {e}"))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("loopback relay: {e}"))?;
    let remote = remote.to_string();
    let task = tokio::spawn(async move {
        match tokio::time::timeout(connect_timeout, listener.accept()).await {
            Ok(Ok((ours, _))) => relay(stream, ours, limits, remote).await,
            _ => format!("the DEALER never reached its loopback relay for {remote}"),
        }
    });
    Ok((format!("tcp://{local}"), task))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greeting() -> Vec<u8> {
        let mut g = vec![0u8; 64];
        g[0] = 0xff;
        g[9] = 0x7f;
        g[10] = 3;
        g[11] = 1;
        g[12..16].copy_from_slice(b"NULL");
        g
    }

    #[test]
    fn accepts_a_normal_stream_in_any_chunking() {
        let mut s = greeting();
        s.extend_from_slice(&[0x04, 5, 1, 2, 3, 4, 5]); // short command
        s.extend_from_slice(&[0x01, 1, b'x', 0x00, 2, b'y', b'z']); // two-frame message
        s.push(0x02); // long frame of 300 bytes
        s.extend_from_slice(&300u64.to_be_bytes());
        s.extend(std::iter::repeat_n(7u8, 300));
        for chunk in [1, 3, 64, 1000] {
            let mut c = FrameChecker::new(1000);
            for part in s.chunks(chunk) {
                c.feed(part).unwrap();
            }
        }
    }

    #[test]
    fn refuses_huge_frames_bad_greetings_and_long_messages() {
        let mut s = greeting();
        s.push(0x02);
        s.extend_from_slice(&(1u64 << 62).to_be_bytes());
        let (good, e) = FrameChecker::new(1 << 20).feed(&s).unwrap_err();
        assert!(e.contains("limit"), "{e}");
        assert_eq!(good, 64, "the greeting passes, the frame header does not");
        let mut bad = greeting();
        bad[12..16].copy_from_slice(b"PLAI");
        assert!(FrameChecker::new(1 << 20).feed(&bad).is_err());
        let mut old = greeting();
        old[10] = 2;
        assert!(FrameChecker::new(1 << 20).feed(&old).is_err());
        // Many small frames of one message add up.
        let mut m = greeting();
        for _ in 0..4 {
            m.extend_from_slice(&[0x01, 200]);
            m.extend(std::iter::repeat_n(0u8, 200));
        }
        assert!(FrameChecker::new(500).feed(&m).is_err());
        // A huge command.
        let mut c = greeting();
        c.push(0x06);
        c.extend_from_slice(&(1u64 << 20).to_be_bytes());
        assert!(FrameChecker::new(1 << 30).feed(&c).is_err());
        // Reserved flag bits.
        let mut r = greeting();
        r.push(0x80);
        assert!(FrameChecker::new(1 << 30).feed(&r).is_err());
    }
}
