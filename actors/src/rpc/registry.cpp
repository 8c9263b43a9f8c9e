#include "troupe/actors/rpc/registry.hpp"

namespace troupe::rpc {

registry::registry(const registry& other) {
  std::lock_guard<std::mutex> lock(other.mutex_);
  entries_ = other.entries_;
}

void registry::put(function_entry e) {
  auto p = std::make_shared<const function_entry>(std::move(e));
  std::lock_guard<std::mutex> lock(mutex_);
  entries_[p->name] = std::move(p);
}

std::shared_ptr<const function_entry> registry::find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second;
}

std::vector<std::string> registry::names() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [k, v] : entries_) out.push_back(k);
  return out;
}

}  // namespace troupe::rpc
