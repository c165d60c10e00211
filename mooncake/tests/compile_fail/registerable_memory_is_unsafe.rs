// Promising a stable address for registration takes an `unsafe impl`.
use mooncake::RegisterableMemory;

struct Stack([u8; 16]);
impl RegisterableMemory for Stack {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    fn len(&self) -> usize {
        16
    }
}

fn main() {}
