// Plain, unregistered memory cannot be a transfer's local side.
use mooncake::Engine;

fn main() {
    let e = Engine::builder().build().unwrap();
    let seg = e.open_segment(e.segment_name()).unwrap();
    let plain = vec![0u8; 4096];
    let mut batch = e.batch(1).unwrap();
    batch.read(&plain[..], 0, &seg, 0x1000, 16).unwrap();
}
