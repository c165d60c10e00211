#include "metadata/base64.h"

#include <cstdint>

namespace mcrs {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// 0..63 for an alphabet character, -1 otherwise ('=' included).
int symbol_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

}  // namespace

std::string base64_encode(std::string_view in) {
    std::string out;
    out.reserve((in.size() + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 3 <= in.size(); i += 3) {
        uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) |
                     uint32_t(uint8_t(in[i + 2]));
        out.push_back(kAlphabet[(v >> 18) & 63]);
        out.push_back(kAlphabet[(v >> 12) & 63]);
        out.push_back(kAlphabet[(v >> 6) & 63]);
        out.push_back(kAlphabet[v & 63]);
    }
    size_t rest = in.size() - i;
    if (rest == 1) {
        uint32_t v = uint32_t(uint8_t(in[i])) << 16;
        out.push_back(kAlphabet[(v >> 18) & 63]);
        out.push_back(kAlphabet[(v >> 12) & 63]);
        out += "==";
    } else if (rest == 2) {
        uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8);
        out.push_back(kAlphabet[(v >> 18) & 63]);
        out.push_back(kAlphabet[(v >> 12) & 63]);
        out.push_back(kAlphabet[(v >> 6) & 63]);
        out.push_back('=');
    }
    return out;
}

bool base64_decode(std::string_view in, std::string &out) {
    out.clear();
    if (in.size() % 4 != 0) return false;
    out.reserve(in.size() / 4 * 3);
    for (size_t i = 0; i < in.size(); i += 4) {
        const bool last = i + 4 == in.size();
        int a = symbol_value(uint8_t(in[i]));
        int b = symbol_value(uint8_t(in[i + 1]));
        if (a < 0 || b < 0) return false;
        const char c3 = in[i + 2], c4 = in[i + 3];
        if (last && c3 == '=' && c4 == '=') {
            if (b & 0x0f) return false;  // non-zero unused bits
            out.push_back(static_cast<char>((a << 2) | (b >> 4)));
            return true;
        }
        int c = symbol_value(uint8_t(c3));
        if (c < 0) return false;
        if (last && c4 == '=') {
            if (c & 0x03) return false;
            out.push_back(static_cast<char>((a << 2) | (b >> 4)));
            out.push_back(static_cast<char>(((b & 0x0f) << 4) | (c >> 2)));
            return true;
        }
        int d = symbol_value(uint8_t(c4));
        if (d < 0) return false;
        uint32_t v = (uint32_t(a) << 18) | (uint32_t(b) << 12) | (uint32_t(c) << 6) | uint32_t(d);
        out.push_back(static_cast<char>((v >> 16) & 0xff));
        out.push_back(static_cast<char>((v >> 8) & 0xff));
        out.push_back(static_cast<char>(v & 0xff));
    }
    return true;
}

}  // namespace mcrs
