// A borrowed registration cannot leave the closure it was made for.
use mooncake::{Access, Engine};

fn main() {
    let e = Engine::builder().build().unwrap();
    let mut buf = vec![0u8; 4096];
    let escaped = e.with_registered(&mut buf, Access::LocalOnly, |reg| reg).unwrap();
    println!("{escaped:?}");
}
