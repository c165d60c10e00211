// An async batch shares ownership of its memory: a plain reference to a
// registration does not enter it (its future could be dropped while the
// transfer runs).
use mooncake::{Access, Engine};

fn main() {
    let e = Engine::builder().build().unwrap();
    let seg = e.open_segment(e.segment_name()).unwrap();
    let local = e.register(vec![0u8; 4096], "*", Access::LocalOnly).unwrap();
    let mut batch = e.async_batch(1).unwrap();
    batch.read(&local, 0, &seg, 0x1000, 16).unwrap();
}
