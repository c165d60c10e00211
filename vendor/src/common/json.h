// A small JSON value type with a strict parser and a compact writer. Peers
// send us JSON over the handshake port, so the parser treats its input as
// hostile: bounded nesting, exact integers up to 64 bits, no trailing bytes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mcrs {

class Json {
public:
    enum class Type { Null, Bool, Int, UInt, Double, String, Array, Object };
    using Array = std::vector<Json>;
    using Object = std::map<std::string, Json>;  // sorted keys, like upstream's writer

    Json() = default;
    Json(std::nullptr_t) {}
    Json(bool b) : type_(Type::Bool), b_(b) {}
    Json(int v) : type_(Type::Int), i_(v) {}
    Json(int64_t v) : type_(Type::Int), i_(v) {}
    Json(uint64_t v) : type_(Type::UInt), u_(v) {}
    Json(unsigned v) : type_(Type::UInt), u_(v) {}
    Json(double v) : type_(Type::Double), d_(v) {}
    Json(const char *s) : type_(Type::String), s_(s) {}
    Json(std::string s) : type_(Type::String), s_(std::move(s)) {}
    Json(Array a) : type_(Type::Array), a_(std::make_shared<Array>(std::move(a))) {}
    Json(Object o) : type_(Type::Object), o_(std::make_shared<Object>(std::move(o))) {}

    static Json array() { return Json(Array{}); }
    static Json object() { return Json(Object{}); }

    Type type() const { return type_; }
    bool is_null() const { return type_ == Type::Null; }
    bool is_bool() const { return type_ == Type::Bool; }
    bool is_string() const { return type_ == Type::String; }
    bool is_array() const { return type_ == Type::Array; }
    bool is_object() const { return type_ == Type::Object; }
    bool is_number() const {
        return type_ == Type::Int || type_ == Type::UInt || type_ == Type::Double;
    }

    // Exact conversions: false when the value is not a number that fits.
    bool get_u64(uint64_t &out) const;
    bool get_i64(int64_t &out) const;
    bool get_bool(bool &out) const;
    const std::string *get_string() const { return is_string() ? &s_ : nullptr; }
    const Array *get_array() const { return is_array() ? a_.get() : nullptr; }
    const Object *get_object() const { return is_object() ? o_.get() : nullptr; }
    // Member lookup on an object; nullptr when absent or not an object.
    const Json *find(const std::string &key) const;

    // Mutation helpers (copy-on-write is not needed: values are built once).
    Json &set(const std::string &key, Json value);
    Json &push(Json value);

    // Compact text, object keys sorted.
    std::string dump() const;
    // Parses exactly one JSON value surrounded by optional whitespace.
    // Throws mcrs::Error(kErrMalformedJson) naming the offset on failure.
    static Json parse(std::string_view text, size_t max_depth = 64);

private:
    void dump_to(std::string &out) const;

    Type type_ = Type::Null;
    bool b_ = false;
    int64_t i_ = 0;
    uint64_t u_ = 0;
    double d_ = 0;
    std::string s_;
    std::shared_ptr<Array> a_;
    std::shared_ptr<Object> o_;
};

// Helpers for reading descriptor fields leniently (missing -> default).
std::string json_string_or(const Json &obj, const std::string &key, const std::string &dflt);

}  // namespace mcrs
