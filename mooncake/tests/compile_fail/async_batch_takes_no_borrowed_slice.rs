// A borrowed registration, even behind an Arc, does not enter an async
// batch: the memory must outlive any transfer, whatever happens to the
// future, so it must be 'static.
use std::sync::Arc;

use mooncake::{Access, Engine};

fn main() {
    let e = Engine::builder().build().unwrap();
    let seg = e.open_segment(e.segment_name()).unwrap();
    let mut batch = e.async_batch(1).unwrap();
    let mut buf = vec![0u8; 4096];
    e.with_registered(&mut buf, Access::LocalOnly, |reg| {
        let shared = Arc::new(reg);
        batch.read(&shared, 0, &seg, 0x1000, 16).unwrap();
    })
    .unwrap();
}
