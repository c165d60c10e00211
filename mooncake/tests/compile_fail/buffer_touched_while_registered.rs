// A buffer registered with `with_registered` cannot be touched meanwhile.
use mooncake::{Access, Engine};

fn main() {
    let e = Engine::builder().build().unwrap();
    let mut buf = vec![0u8; 4096];
    e.with_registered(&mut buf, Access::RemoteAccessible, |_reg| {
        buf[0] = 1;
    })
    .unwrap();
}
