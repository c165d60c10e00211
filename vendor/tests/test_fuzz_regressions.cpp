// Regressions found while fuzzing (vendor/fuzz): each feeds the input that
// showed a problem to the same code, without libFuzzer.
#include <sys/socket.h>

#include "engine_fixture.h"

using namespace mctest;

namespace {

std::string tcp_header(uint64_t size, uint64_t addr, uint8_t opcode) {
    std::string h = le64(size) + le64(addr) + std::string(8, '\0');
    h[16] = static_cast<char>(opcode);
    return h;
}

}  // namespace

// A peer that pipelines requests and then half-closes (FIN) must still get
// the answers to every complete request it sent before the FIN. The
// failing shape: a WRITE whose answer the peer waits for, then a READ
// header on its own, then FIN at once: the server read exactly that header,
// gathered the READ's answer, met EOF on its next read and closed without
// sending it.
TEST(fuzz_tcp_server_answers_requests_sent_before_fin) {
    transfer_engine_t t = make_engine();
    REQUIRE(t);
    std::vector<char> mem(4096);
    fill_random(mem, 7);
    REQUIRE_EQ(registerLocalMemory(t, mem.data(), mem.size(), "cpu:0", 1), 0);
    const uint64_t addr = reinterpret_cast<uint64_t>(mem.data());
    const std::string ok = le64((uint64_t{0x4D435456} << 32) | 0);
    for (int round = 0; round < 20; ++round) {
        RawConn c(data_port(t));
        REQUIRE(c.fd >= 0);
        REQUIRE(c.send_bytes(tcp_header(8, addr, 0x81) + "ABCDEFGH"));
        std::string st;
        char b[8];
        while (st.size() < 8) {
            ssize_t n = ::recv(c.fd, b, 8 - st.size(), 0);
            REQUIRE(n > 0);
            st.append(b, static_cast<size_t>(n));
        }
        REQUIRE(st == ok);
        REQUIRE(c.send_bytes(tcp_header(16, addr + 64, 0x80)));
        ::shutdown(c.fd, SHUT_WR);
        std::string got = c.read_some();
        REQUIRE_EQ(got.size(), size_t(24));
        CHECK(got.substr(0, 8) == ok);
        CHECK(got.substr(8) == std::string(mem.data() + 64, 16));
    }
    destroyTransferEngine(t);
}

// Requests on one connection take effect in order: a READ pipelined before
// a WRITE of the same bytes answers with the bytes before the WRITE. (The
// server gathered the READ's answer by reference and sent it after the
// WRITE had already landed.)
TEST(fuzz_tcp_server_read_then_write_same_bytes_answers_old_bytes) {
    transfer_engine_t t = make_engine();
    REQUIRE(t);
    std::vector<char> mem(4096);
    fill_random(mem, 11);
    const std::string before(mem.data(), 16);
    REQUIRE_EQ(registerLocalMemory(t, mem.data(), mem.size(), "cpu:0", 1), 0);
    const uint64_t addr = reinterpret_cast<uint64_t>(mem.data());
    const std::string ok = le64((uint64_t{0x4D435456} << 32) | 0);
    RawConn c(data_port(t));
    REQUIRE(c.fd >= 0);
    // READ 16, WRITE 8 over its middle, READ 16 again: one send.
    REQUIRE(c.send_bytes(tcp_header(16, addr, 0x80) + tcp_header(8, addr + 4, 0x81) + "ZZZZZZZZ" +
                         tcp_header(16, addr, 0x80)));
    ::shutdown(c.fd, SHUT_WR);
    std::string got = c.read_some();
    REQUIRE_EQ(got.size(), size_t(8 + 16 + 8 + 8 + 16));
    CHECK(got.substr(0, 8) == ok);
    CHECK(got.substr(8, 16) == before);
    CHECK(got.substr(24, 8) == ok && got.substr(32, 8) == ok);
    CHECK(got.substr(40, 16) == before.substr(0, 4) + "ZZZZZZZZ" + before.substr(12, 4));
    destroyTransferEngine(t);
}
