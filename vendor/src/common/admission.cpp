#include "common/admission.h"

#include <algorithm>
#include <utility>

#include "common/log.h"

namespace mcrs {

SourceAdmission::SourceAdmission(const char *listener, PeerFilter allowed, uint32_t total, uint32_t per_source)
    : listener_(listener),
      allowed_(std::move(allowed)),
      total_(total),
      per_source_cap_(per_source ? per_source : std::max<uint32_t>(8, total / 8)) {}

const char *SourceAdmission::refusal(const std::string &src) const {
    if (!allowed_.allows(src)) return "not in the allowed peer networks";
    auto it = count_.find(src);
    if (it != count_.end() && it->second >= per_source_cap_) return "its address is at its connection limit";
    return nullptr;
}

void SourceAdmission::refuse(const std::string &src, const char *why) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    uint64_t skipped = 0;
    if (log_.should_log(skipped))
        MC_LOG(Warn, listener_ << ": refused a connection from " << source_text(src) << ": " << why << " (limits: "
                               << total_ << " in all, " << per_source_cap_ << " per address; " << skipped
                               << " more refusals not logged)");
}

void SourceAdmission::released(const std::string &src) {
    auto it = count_.find(src);
    if (it != count_.end() && --it->second == 0) count_.erase(it);
}

}  // namespace mcrs
