// Where a request goes. The engine decides it in one place: once per peer
// and submit what the peer offers (TransferEngine::peer_routes, which also
// refuses peers it cannot reach), then once per request the route
// (TransferEngine::route_of). Transports never re-route; the only fallback
// is CUDA IPC handing a request whose mapping failed back to TCP.
#pragma once

namespace mcrs {

enum class Route {
    Rdma,      // the peer is an RDMA segment and RDMA is installed here
    CudaIpc,   // a GPU buffer with an IPC handle, same host, other process
    SameHost,  // host memory, same host, the attested same-host path
    Tcp,       // everything else
};

// What one peer offers this engine, decided once per submit.
struct PeerRoutes {
    bool rdma = false;       // every request over RDMA
    bool cuda_ipc = false;   // same host, another process, IPC installed here
    bool same_host = false;  // same host, the peer publishes its same-host socket
};

struct BufferDesc;

// The published GPU buffer the last CUDA IPC request of a run targeted, and
// whether its mapping is usable: requests come in runs against one buffer.
struct IpcRouteMemo {
    const BufferDesc *buffer = nullptr;
    bool usable = false;
};

}  // namespace mcrs
