// The future of a run borrows its batch: the batch (and the memory it
// holds) cannot be dropped or reused while the future exists.
use std::sync::Arc;

use mooncake::{Access, Engine};

fn main() {
    let e = Engine::builder().build().unwrap();
    let seg = e.open_segment(e.segment_name()).unwrap();
    let local = Arc::new(e.register(vec![0u8; 4096], "*", Access::LocalOnly).unwrap());
    let mut batch = e.async_batch(1).unwrap();
    batch.read(&local, 0, &seg, 0x1000, 16).unwrap();
    let done = batch.run();
    drop(batch);
    drop(done);
}
