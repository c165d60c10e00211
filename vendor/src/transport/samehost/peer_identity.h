// Kernel-attested peer identity for the same-host transport.
//
// The target listens on an abstract-namespace Unix stream socket whose name
// is 128 random bits ("mooncake-" + 32 hex digits), published in its
// segment descriptor. Knowing the name lets a process connect, nothing more:
// the target decides who the peer is from what the kernel says about the
// connection, never from anything the peer sends.
//
// What the kernel attests: SO_PEERCRED gives the uid and pid of the process
// that called connect(), recorded by the kernel at connect time; a client
// has no way to put another value there. The target accepts only
//   - uid == our euid: a process that could ptrace us anyway (and that
//     process_vm_* would be allowed to touch by the same ptrace rules), so
//     the path grants it nothing it did not have;
//   - pid > 0: 0 means the peer lives in a PID namespace we cannot see, and
//     its pid would mean nothing to process_vm_*;
//   - pid != getpid(): never the target itself (two engines of one process
//     use TCP), so a request can never make us copy within our own memory.
// The target then takes a pidfd on the peer: SO_PEERPIDFD (Linux >= 6.5)
// hands out a pidfd of the very process that connected, so no pid reuse
// can come between; without it we call pidfd_open(pid) and then check that
// the pidfd's process has not exited: if the connecting process had died
// and its pid been reused by another process between reading the
// credentials and pidfd_open, the pidfd would name the new process. The
// window for that is the pid space wrapping around during those two
// syscalls, and even then the impostor would be subject to the same uid and
// ptrace rules at copy time. Before every copy the target polls the pidfd
// (no wait): once the peer has exited, the connection is dropped, so a pid
// reused later is never copied into. What remains is a pid reused between
// that poll and the copy syscall itself (again: a full wrap during one
// syscall). No pidfd support (ENOSYS) -> refused; the initiator uses TCP.
//
// The initiator checks the other way: SO_PEERCRED of its connection must
// show the target's uid == our euid. A process of another uid that took the
// name (abstract names are per network namespace and first come, first
// served) must not receive our requests nor lie to us about completion.
#pragma once

#include <sys/types.h>

#include <string>

#include "common/socket.h"
#include "core/segment_descriptor.h"  // valid_samehost_socket_name

namespace mcrs {

// A fresh random socket name; empty if no randomness is available.
std::string make_samehost_socket_name();

// Binds and listens on a fresh abstract name (retrying on EADDRINUSE).
// The listener is non-blocking. Invalid Fd and `err` on failure.
Fd listen_samehost(int backlog, std::string &name_out, std::string &err);
// Connects to the abstract name without blocking on a full backlog; the
// returned socket is blocking. Invalid Fd and `err` on failure.
Fd connect_samehost(const std::string &name, std::string &err);

// The kernel's word on who is at the other end of an accepted connection.
struct AttestedPeer {
    pid_t pid = 0;
    Fd pidfd;
};
// Server side: the rules above. False with `why` when refused.
bool attest_initiator(int fd, AttestedPeer &out, std::string &why);
// Client side: the target runs under our euid. False with `why` otherwise.
bool attest_target(int fd, std::string &why);
// True while the pidfd's process has not exited (a poll that never waits).
bool pidfd_alive(int pidfd);

}  // namespace mcrs
