//! The handles that users move between threads are Send (and Sync where
//! sharing is meaningful).
use mooncake::{Batch, Engine, HostBuffer, RegisteredSlice, Registration, RemoteSegment};

fn send<T: Send>() {}
fn sync<T: Sync>() {}

#[test]
fn handles_cross_threads() {
    send::<Engine>();
    sync::<Engine>();
    send::<Registration<HostBuffer>>();
    sync::<Registration<HostBuffer>>();
    send::<Registration<Vec<u8>>>();
    sync::<RegisteredSlice<'static>>();
    send::<RemoteSegment>();
    sync::<RemoteSegment>();
    send::<Batch<'static>>();
    send::<HostBuffer>();
    sync::<HostBuffer>();
}

/// Async futures must be `Send` to run on a work-stealing runtime.
#[cfg(feature = "async")]
#[test]
fn async_handles_cross_threads() {
    send::<mooncake::AsyncBatch>();
    send::<mooncake::Completion<'static>>();
    send::<mooncake::NotificationStream>();
    send::<mooncake::OpenSegment>();
}
