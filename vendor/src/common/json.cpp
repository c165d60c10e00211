#include "common/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "common/error.h"

namespace mcrs {

bool Json::get_u64(uint64_t &out) const {
    switch (type_) {
        case Type::UInt: out = u_; return true;
        case Type::Int:
            if (i_ < 0) return false;
            out = static_cast<uint64_t>(i_);
            return true;
        case Type::Double:
            if (!(d_ >= 0) || d_ != std::floor(d_) || d_ >= 18446744073709551616.0) return false;
            out = static_cast<uint64_t>(d_);
            return true;
        default: return false;
    }
}

bool Json::get_i64(int64_t &out) const {
    switch (type_) {
        case Type::Int: out = i_; return true;
        case Type::UInt:
            if (u_ > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
            out = static_cast<int64_t>(u_);
            return true;
        case Type::Double:
            if (d_ != std::floor(d_) || d_ < -9223372036854775808.0 || d_ >= 9223372036854775808.0)
                return false;
            out = static_cast<int64_t>(d_);
            return true;
        default: return false;
    }
}

bool Json::get_bool(bool &out) const {
    if (type_ != Type::Bool) return false;
    out = b_;
    return true;
}

const Json *Json::find(const std::string &key) const {
    if (!is_object()) return nullptr;
    auto it = o_->find(key);
    return it == o_->end() ? nullptr : &it->second;
}

Json &Json::set(const std::string &key, Json value) {
    if (!is_object()) *this = Json::object();
    (*o_)[key] = std::move(value);
    return *this;
}

Json &Json::push(Json value) {
    if (!is_array()) *this = Json::array();
    a_->push_back(std::move(value));
    return *this;
}

namespace {

void dump_string(std::string &out, const std::string &s) {
    out.push_back('"');
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out.push_back(static_cast<char>(c));
                }
        }
    }
    out.push_back('"');
}

}  // namespace

void Json::dump_to(std::string &out) const {
    switch (type_) {
        case Type::Null: out += "null"; break;
        case Type::Bool: out += b_ ? "true" : "false"; break;
        case Type::Int: out += std::to_string(i_); break;
        case Type::UInt: out += std::to_string(u_); break;
        case Type::Double: {
            if (!std::isfinite(d_)) {
                out += "null";
                break;
            }
            char buf[32];
            std::snprintf(buf, sizeof buf, "%.17g", d_);
            out += buf;
            break;
        }
        case Type::String: dump_string(out, s_); break;
        case Type::Array: {
            out.push_back('[');
            bool first = true;
            for (const Json &v : *a_) {
                if (!first) out.push_back(',');
                first = false;
                v.dump_to(out);
            }
            out.push_back(']');
            break;
        }
        case Type::Object: {
            out.push_back('{');
            bool first = true;
            for (const auto &kv : *o_) {
                if (!first) out.push_back(',');
                first = false;
                dump_string(out, kv.first);
                out.push_back(':');
                kv.second.dump_to(out);
            }
            out.push_back('}');
            break;
        }
    }
}

std::string Json::dump() const {
    std::string out;
    dump_to(out);
    return out;
}

namespace {

class Parser {
public:
    Parser(std::string_view t, size_t max_depth) : t_(t), max_depth_(max_depth) {}

    Json parse_document() {
        skip_ws();
        Json v = parse_value(0);
        skip_ws();
        if (p_ != t_.size()) fail("trailing bytes after the JSON value");
        return v;
    }

private:
    [[noreturn]] void fail(const char *why) {
        throw Error(kErrMalformedJson,
                    std::string("malformed JSON at byte ") + std::to_string(p_) + ": " + why);
    }

    void skip_ws() {
        while (p_ < t_.size() &&
               (t_[p_] == ' ' || t_[p_] == '\t' || t_[p_] == '\n' || t_[p_] == '\r'))
            ++p_;
    }

    bool consume(const char *lit) {
        size_t n = std::char_traits<char>::length(lit);
        if (t_.substr(p_, n) == lit) {
            p_ += n;
            return true;
        }
        return false;
    }

    Json parse_value(size_t depth) {
        if (depth > max_depth_) fail("nesting too deep");
        if (p_ >= t_.size()) fail("unexpected end of input");
        char c = t_[p_];
        if (c == '{') return parse_object(depth);
        if (c == '[') return parse_array(depth);
        if (c == '"') return Json(parse_string());
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
        if (consume("true")) return Json(true);
        if (consume("false")) return Json(false);
        if (consume("null")) return Json(nullptr);
        fail("unexpected character");
    }

    Json parse_object(size_t depth) {
        ++p_;  // '{'
        Json::Object obj;
        skip_ws();
        if (p_ < t_.size() && t_[p_] == '}') {
            ++p_;
            return Json(std::move(obj));
        }
        for (;;) {
            skip_ws();
            if (p_ >= t_.size() || t_[p_] != '"') fail("expected a string key");
            std::string key = parse_string();
            skip_ws();
            if (p_ >= t_.size() || t_[p_] != ':') fail("expected ':'");
            ++p_;
            skip_ws();
            obj[key] = parse_value(depth + 1);
            skip_ws();
            if (p_ >= t_.size()) fail("unterminated object");
            if (t_[p_] == ',') {
                ++p_;
                continue;
            }
            if (t_[p_] == '}') {
                ++p_;
                return Json(std::move(obj));
            }
            fail("expected ',' or '}'");
        }
    }

    Json parse_array(size_t depth) {
        ++p_;  // '['
        Json::Array arr;
        skip_ws();
        if (p_ < t_.size() && t_[p_] == ']') {
            ++p_;
            return Json(std::move(arr));
        }
        for (;;) {
            skip_ws();
            arr.push_back(parse_value(depth + 1));
            skip_ws();
            if (p_ >= t_.size()) fail("unterminated array");
            if (t_[p_] == ',') {
                ++p_;
                continue;
            }
            if (t_[p_] == ']') {
                ++p_;
                return Json(std::move(arr));
            }
            fail("expected ',' or ']'");
        }
    }

    unsigned parse_hex4() {
        if (p_ + 4 > t_.size()) fail("truncated \\u escape");
        unsigned v = 0;
        for (int i = 0; i < 4; ++i) {
            char c = t_[p_++];
            v <<= 4;
            if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
            else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
            else fail("bad hex digit in \\u escape");
        }
        return v;
    }

    static void append_utf8(std::string &out, unsigned cp) {
        if (cp < 0x80) {
            out.push_back(static_cast<char>(cp));
        } else if (cp < 0x800) {
            out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
            out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        } else if (cp < 0x10000) {
            out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
            out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
            out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        } else {
            out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
            out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
            out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
            out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        }
    }

    std::string parse_string() {
        ++p_;  // opening quote
        std::string out;
        for (;;) {
            if (p_ >= t_.size()) fail("unterminated string");
            unsigned char c = static_cast<unsigned char>(t_[p_++]);
            if (c == '"') return out;
            if (c < 0x20) fail("control character in string");
            if (c != '\\') {
                out.push_back(static_cast<char>(c));
                continue;
            }
            if (p_ >= t_.size()) fail("unterminated escape");
            char e = t_[p_++];
            switch (e) {
                case '"': out.push_back('"'); break;
                case '\\': out.push_back('\\'); break;
                case '/': out.push_back('/'); break;
                case 'b': out.push_back('\b'); break;
                case 'f': out.push_back('\f'); break;
                case 'n': out.push_back('\n'); break;
                case 'r': out.push_back('\r'); break;
                case 't': out.push_back('\t'); break;
                case 'u': {
                    unsigned cp = parse_hex4();
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        if (p_ + 2 > t_.size() || t_[p_] != '\\' || t_[p_ + 1] != 'u')
                            fail("unpaired surrogate");
                        p_ += 2;
                        unsigned lo = parse_hex4();
                        if (lo < 0xDC00 || lo > 0xDFFF) fail("bad low surrogate");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        fail("unpaired low surrogate");
                    }
                    append_utf8(out, cp);
                    break;
                }
                default: fail("unknown escape");
            }
        }
    }

    Json parse_number() {
        size_t start = p_;
        bool neg = false;
        if (t_[p_] == '-') {
            neg = true;
            ++p_;
        }
        if (p_ >= t_.size() || !(t_[p_] >= '0' && t_[p_] <= '9')) fail("bad number");
        if (t_[p_] == '0' && p_ + 1 < t_.size() && t_[p_ + 1] >= '0' && t_[p_ + 1] <= '9')
            fail("leading zero in number");
        bool is_int = true;
        while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
        if (p_ < t_.size() && t_[p_] == '.') {
            is_int = false;
            ++p_;
            if (p_ >= t_.size() || !(t_[p_] >= '0' && t_[p_] <= '9')) fail("bad fraction");
            while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
        }
        if (p_ < t_.size() && (t_[p_] == 'e' || t_[p_] == 'E')) {
            is_int = false;
            ++p_;
            if (p_ < t_.size() && (t_[p_] == '+' || t_[p_] == '-')) ++p_;
            if (p_ >= t_.size() || !(t_[p_] >= '0' && t_[p_] <= '9')) fail("bad exponent");
            while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
        }
        std::string text(t_.substr(start, p_ - start));
        if (is_int) {
            // Exact 64-bit parsing; values beyond 64 bits become doubles.
            const char *digits = text.c_str() + (neg ? 1 : 0);
            uint64_t v = 0;
            bool overflow = false;
            for (const char *d = digits; *d; ++d) {
                unsigned dv = static_cast<unsigned>(*d - '0');
                if (v > (UINT64_MAX - dv) / 10) {
                    overflow = true;
                    break;
                }
                v = v * 10 + dv;
            }
            if (!overflow) {
                if (!neg) return Json(v);
                if (v <= static_cast<uint64_t>(INT64_MAX) + 1) {
                    if (v == static_cast<uint64_t>(INT64_MAX) + 1) return Json(INT64_MIN);
                    return Json(-static_cast<int64_t>(v));
                }
            }
        }
        return Json(std::strtod(text.c_str(), nullptr));
    }

    std::string_view t_;
    size_t p_ = 0;
    size_t max_depth_;
};

}  // namespace

Json Json::parse(std::string_view text, size_t max_depth) {
    Parser p(text, max_depth);
    return p.parse_document();
}

std::string json_string_or(const Json &obj, const std::string &key, const std::string &dflt) {
    const Json *v = obj.find(key);
    if (!v || !v->is_string()) return dflt;
    return *v->get_string();
}

}  // namespace mcrs
