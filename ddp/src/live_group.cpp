// Live recovery of a data-parallel job (Note [live recovery] in live_group.hpp).
#include "troupe/ddp/live_group.hpp"

#include <algorithm>
#include <cstring>

#include "troupe/actors/store.hpp"
#include "troupe/autograd/checkpoint.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::ddp {

namespace {

state_dict under(const state_dict& all, const std::string& prefix) {
  state_dict out;
  for (auto it = all.lower_bound(prefix); it != all.end() && it->first.rfind(prefix, 0) == 0; ++it)
    out.emplace(it->first.substr(prefix.size()), it->second);
  return out;
}

const std::int64_t* entry(const state_dict& all, const std::string& key, std::int64_t numel) {
  const auto it = all.find(key);
  if (it == all.end() || it->second.dtype() != dtype::int64 || it->second.numel() != numel)
    throw error(errc::checkpoint_corrupt, "live_group: the received state has no valid entry '" + key + "'");
  return it->second.data<std::int64_t>();
}

}  // namespace

// The tracked state, and the counters and generators as they were at the last commit.
struct live_group::tracked {
  std::vector<std::pair<std::string, nn::module*>> modules;
  std::vector<std::pair<std::string, optim::optimizer*>> optimizers;
  std::vector<std::pair<std::string, generator*>> generators;
  std::vector<std::pair<std::string, std::int64_t*>> counters;
  std::vector<generator> saved_generators;
  std::vector<std::int64_t> saved_counters;

  void snapshot() {
    saved_generators.clear();
    saved_counters.clear();
    for (const auto& g : generators) saved_generators.push_back(*g.second);
    for (const auto& c : counters) saved_counters.push_back(*c.second);
  }
  void roll_back() const {
    for (std::size_t i = 0; i < saved_generators.size(); ++i) *generators[i].second = saved_generators[i];
    for (std::size_t i = 0; i < saved_counters.size(); ++i) *counters[i].second = saved_counters[i];
  }
  state_dict collect() const {
    state_dict all;
    for (const auto& [name, m] : modules)
      for (auto& [k, t] : m->state_dict()) all.emplace("module/" + name + "/" + k, t);
    for (const auto& [name, o] : optimizers)
      for (auto& [k, t] : o->state_dict()) all.emplace("optimizer/" + name + "/" + k, t);
    for (const auto& [name, g] : generators)
      all.emplace("generator/" + name,
                  from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(g->seed()), static_cast<std::int64_t>(g->offset())}));
    for (const auto& [name, v] : counters) all.emplace("counter/" + name, from_vector(std::vector<std::int64_t>{*v}));
    return all;
  }
  // Checks every small entry before the modules change, so a bad state changes little.
  void apply(const state_dict& all) const {
    for (const auto& [name, g] : generators) entry(all, "generator/" + name, 2);
    for (const auto& [name, v] : counters) entry(all, "counter/" + name, 1);
    for (const auto& [name, m] : modules) m->load_state_dict(under(all, "module/" + name + "/"), true);
    for (const auto& [name, o] : optimizers) o->load_state_dict(under(all, "optimizer/" + name + "/"));
    for (const auto& [name, g] : generators) {
      const auto* p = entry(all, "generator/" + name, 2);
      *g = generator(static_cast<std::uint64_t>(p[0]));
      g->set_offset(static_cast<std::uint64_t>(p[1]));
    }
    for (const auto& [name, v] : counters) *v = entry(all, "counter/" + name, 1)[0];
  }
};

live_group::live_group(store_client& store, int rank, int world_size, std::string name, bool replacement, live_group_options opts)
    : store_(store), rank_(rank), world_size_(world_size), name_(std::move(name)), replacement_(replacement),
      opts_(std::move(opts)), state_(std::make_unique<tracked>()) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw error(errc::bad_argument, "live_group: rank " + std::to_string(rank) + " outside [0, world size " + std::to_string(world_size) + ")");
  if (name_.empty()) throw error(errc::bad_argument, "live_group: the name is empty");
}

live_group::~live_group() = default;

void live_group::track(const std::string& name, nn::module& m) { state_->modules.emplace_back(name, &m); }
void live_group::track(const std::string& name, optim::optimizer& opt) { state_->optimizers.emplace_back(name, &opt); }
void live_group::track(const std::string& name, generator& gen) { state_->generators.emplace_back(name, &gen); }
void live_group::track(const std::string& name, std::int64_t& value) { state_->counters.emplace_back(name, &value); }

std::string live_group::key(const std::string& tail) const { return "troupe/live/" + name_ + "/" + tail; }

std::string live_group::gen_key(std::int64_t g, const std::string& tail) const {
  std::string k = key("g");
  k += std::to_string(g);
  k += '/';
  k += tail;
  return k;
}

bool live_group::recoverable(const error& e) noexcept { return e.code() == errc::peer_lost; }

process_group& live_group::group() {
  if (!group_) throw error(errc::invalid_state, "live_group::group() before start()");
  return *group_;
}

// Marks this rank a member of generation g, then meets the others as group "<name>-g<g>".
void live_group::form(std::int64_t g) {
  group_.reset();  // the broken group's threads and segments go first
  generation_ = g;
  store_.add(gen_key(g, "member/" + std::to_string(rank_)), 1);
  group_ = std::make_unique<process_group>(store_, rank_, world_size_, name_ + "-g" + std::to_string(g), opts_.group);
}

// The generation a replacement joins: the first one its dead predecessor was not a member of.
std::int64_t live_group::find_generation() {
  std::int64_t g = std::stoll(store_.get(key("gen"), opts_.timeout));
  while (store_.add(gen_key(g, "member/" + std::to_string(rank_)), 0) > 0) {
    store_.wait({gen_key(g + 1, "open")}, opts_.timeout);
    ++g;
  }
  return g;
}

std::int64_t live_group::start() {
  if (group_) throw error(errc::invalid_state, "live_group::start() called twice");
  if (!replacement_) {
    committed_ = 0;
    state_->snapshot();
    form(0);
    store_.set(key("gen"), "0");
    return 0;
  }
  form(find_generation());
  return sync();
}

void live_group::commit(std::int64_t step) {
  committed_ = step;
  state_->snapshot();
}

std::int64_t live_group::recover() {
  const std::int64_t g = generation_ + 1;
  store_.set(gen_key(g, "open"), "1");
  store_.set(key("gen"), std::to_string(g));
  form(g);
  return sync();
}

// Every rank to the newest committed state (Note [live recovery]: sync).
std::int64_t live_group::sync() {
  if (committed_ >= 0) state_->roll_back();
  const auto world = static_cast<std::int64_t>(world_size_);
  tensor steps = zeros({world}, {dtype::int64});
  group_->allgather(steps, from_vector(std::vector<std::int64_t>{committed_})).wait(opts_.timeout);
  const std::int64_t* s = steps.data<std::int64_t>();
  const int source = static_cast<int>(std::max_element(s, s + world) - s);
  const std::int64_t step = s[source];
  if (step < 0) throw error(errc::invalid_state, "live_group: no rank of group " + group_->name() + " holds a committed state");
  std::string bytes;
  if (rank_ == source) {
    checkpoint_state st;
    st.model = state_->collect();
    st.step = step;
    bytes = encode_checkpoint(st);
  }
  tensor size = from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(bytes.size())});
  group_->broadcast(size, source).wait(opts_.timeout);
  tensor payload = zeros({size.data<std::int64_t>()[0]}, {dtype::uint8});
  if (rank_ == source) std::memcpy(payload.data_ptr(), bytes.data(), bytes.size());
  group_->broadcast(payload, source).wait(opts_.timeout);
  if (rank_ != source) {
    const auto* p = static_cast<const char*>(payload.data_ptr());
    const checkpoint_state st = decode_checkpoint(std::string_view(p, static_cast<std::size_t>(payload.numel())),
                                                  "the state of rank " + std::to_string(source));
    if (st.step != step) throw error(errc::checkpoint_corrupt, "live_group: rank " + std::to_string(source) + " sent another step");
    state_->apply(st.model);
  }
  commit(step);
  last_source_ = source;
  last_bytes_ = static_cast<std::uint64_t>(payload.numel());
  return step;
}

}  // namespace troupe::ddp
