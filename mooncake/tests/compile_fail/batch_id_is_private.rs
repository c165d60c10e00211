// The raw batch id cannot be read (and so not forged or reused).
use mooncake::Engine;

fn main() {
    let e = Engine::builder().build().unwrap();
    let batch = e.batch(1).unwrap();
    let id: u64 = batch.id;
    println!("{id}");
}
