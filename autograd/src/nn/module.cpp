// The module base: registration, recursive traversal, state dicts, modes and device moves.
#include "troupe/autograd/nn/module.hpp"

#include <algorithm>
#include <set>

#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/autograd_hook.hpp"

namespace troupe::nn {

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string list_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "" : ", ") + ("'" + k + "'");
  return out;
}

// Points `dst`'s handle at the geometry and storage of `src` (same tensor identity, new data).
void rebind(const tensor& dst, const tensor& src) {
  auto& d = *dst.impl();
  const auto& s = *src.impl();
  d.storage = s.storage;
  d.sizes = s.sizes;
  d.strides = s.strides;
  d.offset = s.offset;
  d.dtype = s.dtype;
  d.base = nullptr;
}

}  // namespace

void module::check_new_name(const std::string& name, bool defined) const {
  if (name.empty() || name.find('.') != std::string::npos)
    throw error(errc::bad_argument, "module: invalid name '" + name + "' (must be non-empty, without '.')");
  if (!defined) throw error(errc::bad_argument, "module: registering '" + name + "' with an undefined value");
  const auto taken = [&](const auto& v) {
    return std::any_of(v.begin(), v.end(), [&](const auto& e) { return e.first == name; });
  };
  if (taken(params_) || taken(buffers_) || taken(children_))
    throw error(errc::bad_argument, "module: name '" + name + "' is already registered");
}

tensor& module::register_parameter(const std::string& name, tensor& t, bool requires_grad) {
  check_new_name(name, t.defined());
  if (requires_grad) set_requires_grad(t, true);
  params_.emplace_back(name, t);
  return t;
}

tensor& module::register_buffer(const std::string& name, tensor& t) {
  check_new_name(name, t.defined());
  buffers_.emplace_back(name, t);
  return t;
}

void module::collect(const std::string& prefix, bool params,
                     std::vector<std::pair<std::string, tensor>>& out) const {
  for (const auto& [name, t] : params ? params_ : buffers_) out.emplace_back(join(prefix, name), t);
  for (const auto& [name, child] : children_) child->collect(join(prefix, name), params, out);
}

tensor_list module::parameters() const {
  tensor_list out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, tensor>> module::named_parameters() const {
  std::vector<std::pair<std::string, tensor>> out;
  collect("", true, out);
  return out;
}

std::vector<std::pair<std::string, tensor>> module::named_buffers() const {
  std::vector<std::pair<std::string, tensor>> out;
  collect("", false, out);
  return out;
}

troupe::state_dict module::state_dict() const {
  troupe::state_dict sd;
  for (const auto& [name, t] : named_parameters()) sd.emplace(name, t.detach());
  for (const auto& [name, t] : named_buffers()) sd.emplace(name, t.detach());
  return sd;
}

void module::load_state_dict(const troupe::state_dict& sd, bool strict) {
  auto own = named_parameters();
  for (auto& b : named_buffers()) own.push_back(std::move(b));
  std::vector<std::string> missing, unexpected;
  std::set<std::string> own_names;
  // Validate everything first, so a bad dict leaves the module untouched.
  for (const auto& [name, t] : own) {
    own_names.insert(name);
    const auto it = sd.find(name);
    if (it == sd.end()) { missing.push_back(name); continue; }
    const tensor& src = it->second;
    if (!src.defined())
      throw error(errc::bad_argument, "load_state_dict: key '" + name + "' holds an undefined tensor");
    if (src.shape() != t.shape())
      throw error(errc::shape_mismatch, "load_state_dict: key '" + name + "': checkpoint shape " +
                                            shape_to_string(src.shape()) + ", module shape " +
                                            shape_to_string(t.shape()));
    if (src.dtype() != t.dtype())
      throw error(errc::dtype_mismatch, "load_state_dict: key '" + name + "': checkpoint dtype " +
                                            std::string(troupe::to_string(src.dtype())) + ", module dtype " +
                                            std::string(troupe::to_string(t.dtype())));
  }
  for (const auto& [name, t] : sd)
    if (!own_names.count(name)) unexpected.push_back(name);
  if (strict && (!missing.empty() || !unexpected.empty()))
    throw error(errc::bad_argument, "load_state_dict (strict): missing keys [" + list_keys(missing) +
                                        "], unexpected keys [" + list_keys(unexpected) + "]");
  no_grad_guard guard;
  for (auto& [name, t] : own) {
    const auto it = sd.find(name);
    if (it != sd.end() && !it->second.is_same(t)) t.copy_(it->second);
  }
}

void module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void module::to(troupe::device d) {
  no_grad_guard guard;
  auto move = [&](const tensor& t) {
    if (t.device() == d) return;
    rebind(t, t.detach().to(d));
  };
  for (auto& [name, t] : named_parameters()) {
    if (grad(t).defined()) set_grad(t, tensor());
    move(t);
  }
  for (auto& [name, t] : named_buffers()) move(t);
}

void module::zero_grad() {
  for (auto& t : parameters()) troupe::zero_grad(t);
}

}  // namespace troupe::nn
