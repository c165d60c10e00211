// A registration cannot be dropped while a batch that uses it is alive.
use mooncake::{Access, Engine, HostBuffer};

fn main() {
    let e = Engine::builder().build().unwrap();
    let local = e.register(HostBuffer::new(4096).unwrap(), "*", Access::LocalOnly).unwrap();
    let seg = e.open_segment(e.segment_name()).unwrap();
    let mut batch = e.batch(1).unwrap();
    batch.read(&local, 0, &seg, 0x1000, 16).unwrap();
    drop(local);
    batch.submit().unwrap();
}
