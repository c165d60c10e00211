// A batch that uses a borrowed registration cannot outlive the closure.
use mooncake::{Access, Engine};

fn main() {
    let e = Engine::builder().build().unwrap();
    let seg = e.open_segment(e.segment_name()).unwrap();
    let mut batch = e.batch(1).unwrap();
    let mut buf = vec![0u8; 4096];
    e.with_registered(&mut buf, Access::LocalOnly, |reg| {
        batch.read(reg, 0, &seg, 0x1000, 16).unwrap();
    })
    .unwrap();
    batch.submit().unwrap();
}
