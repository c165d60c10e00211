// The CPU cannot write registered memory while a batch may transfer it.
use mooncake::{Access, Engine, HostBuffer};

fn main() {
    let e = Engine::builder().build().unwrap();
    let mut local = e.register(HostBuffer::new(4096).unwrap(), "*", Access::LocalOnly).unwrap();
    let seg = e.open_segment(e.segment_name()).unwrap();
    let mut batch = e.batch(1).unwrap();
    batch.write(&local, 0, &seg, 0x1000, 16).unwrap();
    local.write_at(0, b"racing the NIC").unwrap();
    batch.submit().unwrap();
}
