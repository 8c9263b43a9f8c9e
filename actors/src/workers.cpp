// The worker list, read from the names the nodes publish under "troupe/worker/<rank>".
#include "troupe/actors/workers.hpp"

#include "troupe/actors/node.hpp"

namespace troupe {

std::vector<worker_info> workers(node& n, std::chrono::milliseconds timeout) {
  const std::int32_t world = n.info().world_size;
  std::vector<std::string> keys;
  for (std::int32_t r = 0; r < world; ++r) keys.push_back("troupe/worker/" + std::to_string(r));
  try {
    n.store().wait(keys, timeout);
  } catch (const error& e) {
    if (e.code() != errc::timeout) throw;
    throw error(errc::timeout, n.info().name + ": the worker list is incomplete after " + std::to_string(timeout.count()) +
                                   " ms (not every rank has started): " + e.message());
  }
  std::vector<worker_info> out;
  for (std::int32_t r = 0; r < world; ++r) out.push_back(worker_info{n.store().get(keys[r], timeout), r, world});
  return out;
}

std::vector<worker_info> workers(node& n) { return workers(n, n.default_timeout()); }

worker_info get_worker_info(node& n, const std::string& name, std::chrono::milliseconds timeout) {
  const auto all = workers(n, timeout);
  std::string names;
  for (const auto& w : all) {
    if (w.name == name) return w;
    if (!names.empty()) names += ", ";
    names += w.name;
  }
  throw error(errc::bad_argument, "get_worker_info: no worker is named '" + name + "'; the job's workers are " + names);
}

worker_info get_worker_info(node& n, const std::string& name) { return get_worker_info(n, name, n.default_timeout()); }

}  // namespace troupe
