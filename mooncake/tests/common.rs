//! Helpers shared by the integration tests: engines on 127.0.0.1 and a
//! deterministic byte pattern.
#![allow(dead_code)]

use std::time::Duration;

use mooncake::{Engine, HostBuffer};

/// An engine on 127.0.0.1 that moves data over TCP (the same-host path is
/// off, so that two engines of one test process exercise the network).
pub fn engine() -> Engine {
    engine_with(false)
}

/// An engine on 127.0.0.1; `same_host` switches the same-host path.
pub fn engine_with(same_host: bool) -> Engine {
    Engine::builder()
        .local_host("127.0.0.1")
        .tcp_progress_timeout(Duration::from_secs(5))
        .handshake_timeout(Duration::from_secs(5))
        .same_host_path(same_host)
        .build()
        .expect("engine on 127.0.0.1")
}

/// Byte `i` of the pattern for `seed`.
pub fn pattern_byte(seed: u64, i: usize) -> u8 {
    let mut x = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 29;
    (x & 0xff) as u8
}

pub fn patterned(len: usize, seed: u64) -> HostBuffer {
    let mut b = HostBuffer::new(len).unwrap();
    for (i, v) in b.iter_mut().enumerate() {
        *v = pattern_byte(seed, i);
    }
    b
}

/// Index of the first byte where `got` differs from the pattern at `start`.
pub fn first_mismatch(got: &[u8], seed: u64, start: usize) -> Option<usize> {
    got.iter()
        .enumerate()
        .find(|(i, b)| **b != pattern_byte(seed, start + i))
        .map(|(i, _)| i)
}

/// A peer that answers the metadata handshake with a descriptor whose data
/// port accepts connections and then never answers: a stand-in for a hung
/// process.
pub struct SilentPeer {
    pub segment_name: String,
    pub buffer_addr: u64,
    _threads: Vec<std::thread::JoinHandle<()>>,
}

impl SilentPeer {
    pub fn start() -> Self {
        use std::io::{Read, Write};
        use std::net::TcpListener;
        let data = TcpListener::bind("127.0.0.1:0").unwrap();
        let data_port = data.local_addr().unwrap().port();
        let hs = TcpListener::bind("127.0.0.1:0").unwrap();
        let hs_port = hs.local_addr().unwrap().port();
        let segment_name = format!("127.0.0.1:{hs_port}");
        let buffer_addr = 0x10_0000u64;
        let desc = format!(
            "{{\"name\":\"{segment_name}\",\"protocol\":\"tcp\",\"tcp_data_host\":\"127.0.0.1\",\
             \"tcp_data_port\":{data_port},\"tcp_proto_version\":2,\
             \"buffers\":[{{\"addr\":{buffer_addr},\"length\":1048576,\"name\":\"cpu:0\"}}]}}"
        );
        let t1 = std::thread::spawn(move || {
            for mut c in hs.incoming().flatten() {
                let mut len = [0u8; 8];
                if c.read_exact(&mut len).is_err() {
                    continue;
                }
                let n = u64::from_le_bytes(len) as usize;
                let mut body = vec![0u8; n.min(1 << 20)];
                if c.read_exact(&mut body).is_err() {
                    continue;
                }
                let mut reply = ((desc.len() + 1) as u64).to_le_bytes().to_vec();
                reply.push(body[0]);
                reply.extend_from_slice(desc.as_bytes());
                let _ = c.write_all(&reply);
            }
        });
        let t2 = std::thread::spawn(move || {
            let mut held = Vec::new();
            for c in data.incoming().flatten() {
                held.push(c); // accept, never read or answer
            }
        });
        Self {
            segment_name,
            buffer_addr,
            _threads: vec![t1, t2],
        }
    }
}
