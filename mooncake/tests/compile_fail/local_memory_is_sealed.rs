// Only the crate's registration types are local memory.
use mooncake::LocalMemory;

struct Fake;
impl LocalMemory for Fake {}

fn main() {}
