// distributed_data_parallel: construction checks, state broadcast, hooks, forward, no_sync.
#include "troupe/ddp/distributed_data_parallel.hpp"

#include <cstring>
#include <sstream>

#include "reducer.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/ddp/host_staged_group.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::ddp {

namespace {

std::string describe_param(const std::string& name, const tensor& t) {
  return name + " " + std::string(troupe::to_string(t.dtype())) + shape_to_string(t.shape());
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

/// Every rank's text, gathered through the group (lengths first, then padded bytes).
std::vector<std::string> allgather_strings(collective_group& pg, const std::string& mine, std::chrono::milliseconds timeout) {
  const int w = pg.world_size();
  const troupe::device dev = pg.device();
  tensor len = full({1}, static_cast<double>(mine.size()), {dtype::int64, dev});
  tensor lens = zeros({w}, {dtype::int64, dev});
  pg.allgather(lens, len).wait(timeout);
  lens = lens.cpu();
  std::int64_t max_len = 0;
  for (int r = 0; r < w; ++r) max_len = std::max(max_len, lens.data<std::int64_t>()[r]);
  tensor bytes = zeros({max_len}, {dtype::uint8});
  if (!mine.empty()) std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  tensor all = zeros({max_len * w}, {dtype::uint8, dev});
  pg.allgather(all, bytes.to(dev)).wait(timeout);
  all = all.cpu();
  std::vector<std::string> out;
  for (int r = 0; r < w; ++r)
    out.emplace_back(static_cast<const char*>(all.data_ptr()) + r * max_len,
                     static_cast<std::size_t>(lens.data<std::int64_t>()[r]));
  return out;
}

/// Throws on every rank when some rank's parameter list differs from rank 0's.
void verify_same_model(collective_group& pg, const std::vector<std::pair<std::string, tensor>>& named,
                       std::chrono::milliseconds timeout) {
  std::string mine;
  for (const auto& [n, t] : named) mine += describe_param(n, t) + "\n";
  const auto all = allgather_strings(pg, mine, timeout);
  const auto ref = split_lines(all[0]);
  for (int r = 1; r < pg.world_size(); ++r) {
    const auto other = split_lines(all[r]);
    for (std::size_t i = 0; i < std::max(ref.size(), other.size()); ++i) {
      const std::string a = i < ref.size() ? ref[i] : "(none)";
      const std::string b = i < other.size() ? other[i] : "(none)";
      if (a == b) continue;
      const std::string an = a.substr(0, a.find(' ')), bn = b.substr(0, b.find(' '));
      const std::string at = a.substr(a.find(' ') + 1), bt = b.substr(b.find(' ') + 1);
      errc code = errc::bad_argument;
      if (an == bn && a != "(none)" && b != "(none)")
        code = at.substr(0, at.find('[')) != bt.substr(0, bt.find('[')) ? errc::dtype_mismatch : errc::shape_mismatch;
      throw error(code, "distributed_data_parallel: the model differs across ranks at parameter " + std::to_string(i) +
                            ": rank 0 has '" + a + "', rank " + std::to_string(r) + " has '" + b +
                            "' (every rank must build the same model)");
    }
  }
}

void broadcast_all(collective_group& pg, const std::vector<std::pair<std::string, tensor>>& named,
                   std::chrono::milliseconds timeout) {
  std::vector<work> works;
  for (const auto& [n, t] : named) works.push_back(pg.broadcast(t.detach(), 0));
  for (auto& w : works) w.wait(timeout);
}

}  // namespace

struct distributed_data_parallel::impl {
  std::shared_ptr<nn::module> module;
  std::shared_ptr<nn::unary_module> unary;  // exactly one of unary and multi is set
  std::shared_ptr<nn::multi_input_module> multi;
  collective_group& user_group;
  std::unique_ptr<host_staged_group> staged;  // CUDA parameters over a CPU group
  collective_group* group_ptr;
  ddp_options opts;
  tensor_list params;
  bool sync = true;
  std::int64_t forwards = 0;  // step(): the step of the library's fault points
  std::vector<hook_handle> hooks;
  std::unique_ptr<detail::reducer> reducer;
  shutdown_hook on_node_shutdown;  // after the reducer: unregisters before it goes (Note [shutdown hooks])

  impl(std::shared_ptr<nn::unary_module> u, std::shared_ptr<nn::multi_input_module> m, collective_group& g, ddp_options o)
      : unary(std::move(u)), multi(std::move(m)), user_group(g), group_ptr(&g), opts(o) {
    if (unary) module = unary;
    else module = multi;
  }

  collective_group& group() { return *group_ptr; }

  /// CUDA parameters over a CPU group: the collectives stage through host memory
  /// (Note [Host-staged collectives]).
  void stage_if_needed(const tensor& first_param) {
    if (!user_group.device().is_cpu() || !first_param.device().is_cuda()) return;
    staged = std::make_unique<host_staged_group>(user_group, first_param.device());
    group_ptr = staged.get();
  }

  void rebuild_from_rank0_order() {
    collective_group& group = *group_ptr;
    const auto& order = reducer->ready_order();
    tensor t = zeros({static_cast<std::int64_t>(params.size())}, {dtype::int64});
    for (std::size_t i = 0; i < order.size() && i < params.size(); ++i) t.data<std::int64_t>()[i] = static_cast<std::int64_t>(order[i]);
    if (group.device() != t.device()) t = t.to(group.device());
    group.broadcast(t, 0).wait(opts.timeout);
    t = t.cpu();
    std::vector<std::size_t> ord;
    for (std::size_t i = 0; i < params.size(); ++i) ord.push_back(static_cast<std::size_t>(t.data<std::int64_t>()[i]));
    reducer->build(detail::assign_buckets(params, ord, opts.first_bucket_cap_mb, opts.bucket_cap_mb));
    reducer->mark_rebuilt();
  }
};

distributed_data_parallel::distributed_data_parallel(std::shared_ptr<nn::unary_module> module, collective_group& group,
                                                     ddp_options opts)
    : impl_(std::make_unique<impl>(std::move(module), nullptr, group, opts)) {
  setup();
}

distributed_data_parallel::distributed_data_parallel(std::shared_ptr<nn::multi_input_module> module, collective_group& group,
                                                     ddp_options opts)
    : impl_(std::make_unique<impl>(nullptr, std::move(module), group, opts)) {
  setup();
}

void distributed_data_parallel::setup() {
  const ddp_options& opts = impl_->opts;
  if (!impl_->module) throw error(errc::bad_argument, "distributed_data_parallel: null module");
  if (opts.bucket_cap_mb <= 0 || opts.first_bucket_cap_mb <= 0)
    throw error(errc::bad_argument, "distributed_data_parallel: bucket caps must be positive");
  const auto named = impl_->module->named_parameters();
  if (named.empty()) throw error(errc::bad_argument, "distributed_data_parallel: the module has no parameters");
  impl_->stage_if_needed(named.front().second);
  collective_group& group = impl_->group();
  std::vector<std::string> names;
  for (const auto& [n, t] : named) {
    if (t.device() != group.device() || !t.is_contiguous())
      throw error(errc::device_mismatch, "distributed_data_parallel: parameter '" + n + "' is a " +
                                             (t.is_contiguous() ? "" : "non-contiguous ") + troupe::to_string(t.device()) +
                                             " tensor; group '" + group.name() + "' reduces contiguous " +
                                             troupe::to_string(group.device()) + " tensors");
    if (!t.requires_grad())
      throw error(errc::bad_argument, "distributed_data_parallel: parameter '" + n + "' does not require grad");
    impl_->params.push_back(t);
    names.push_back(n);
  }
  verify_same_model(group, named, opts.timeout);
  broadcast_all(group, named, opts.timeout);
  broadcast_all(group, impl_->module->named_buffers(), opts.timeout);
  impl_->reducer = std::make_unique<detail::reducer>(impl_->params, names, group, opts,
                                                     opts.node != nullptr ? &opts.node->system() : nullptr);
  std::vector<std::size_t> reverse;
  for (std::size_t i = impl_->params.size(); i-- > 0;) reverse.push_back(i);
  impl_->reducer->build(detail::assign_buckets(impl_->params, reverse, opts.first_bucket_cap_mb, opts.bucket_cap_mb));
  auto* red = impl_->reducer.get();
  if (opts.node != nullptr) impl_->on_node_shutdown = opts.node->at_shutdown([red] { red->detach(); });
  for (std::size_t i = 0; i < impl_->params.size(); ++i)
    impl_->hooks.push_back(register_post_accumulate_grad_hook(impl_->params[i], [red, i](const tensor&) { red->on_grad_ready(i); }));
}

distributed_data_parallel::~distributed_data_parallel() {
  for (auto& h : impl_->hooks) h.remove();
}

tensor distributed_data_parallel::forward(const tensor& input) { return forward(tensor_list{input}); }

tensor distributed_data_parallel::forward(const tensor_list& inputs) {
  if (impl_->unary && inputs.size() != 1)
    throw error(errc::bad_argument, "distributed_data_parallel::forward: the wrapped unary_module takes 1 input, got " +
                                        std::to_string(inputs.size()));
  impl_->reducer->check_attached("forward");
  impl_->reducer->check_previous_finished();
  const std::int64_t step = impl_->forwards++;
  impl_->reducer->set_step(step);
  impl_->group().fault_point("forward", step);  // Note [fault events]
  if (impl_->sync && impl_->reducer->needs_rebuild()) impl_->rebuild_from_rank0_order();
  if (impl_->opts.broadcast_buffers) broadcast_all(impl_->group(), impl_->module->named_buffers(), impl_->opts.timeout);
  tensor out = impl_->unary ? impl_->unary->forward(inputs.front()) : impl_->multi->forward(inputs);
  if (grad_mode::is_enabled()) prepare_for_backward({out});
  return out;
}

void distributed_data_parallel::prepare_for_backward(const tensor_list& outputs) {
  impl_->reducer->prepare(impl_->sync, outputs);
}

nn::unary_module& distributed_data_parallel::module() const {
  if (!impl_->unary)
    throw error(errc::invalid_state, "distributed_data_parallel::module(): the wrapped module is a multi_input_module; use wrapped()");
  return *impl_->unary;
}
nn::module& distributed_data_parallel::wrapped() const { return *impl_->module; }
tensor_list distributed_data_parallel::parameters() const { return impl_->params; }
void distributed_data_parallel::register_comm_hook(comm_hook hook) {
  if (!hook) throw error(errc::bad_argument, "distributed_data_parallel::register_comm_hook: empty hook");
  impl_->reducer->set_hook(std::move(hook));
}

distributed_data_parallel::no_sync_guard::no_sync_guard(distributed_data_parallel& d) : ddp_(d), previous_(d.impl_->sync) {
  d.impl_->sync = false;
}
distributed_data_parallel::no_sync_guard::~no_sync_guard() { ddp_.impl_->sync = previous_; }

std::vector<std::vector<std::size_t>> distributed_data_parallel::bucket_assignment() const {
  return impl_->reducer->assignment();
}
std::vector<std::size_t> distributed_data_parallel::last_ready_order() const { return impl_->reducer->ready_order(); }
std::vector<int> distributed_data_parallel::last_launch_order() const { return impl_->reducer->launch_order(); }
reduction_timeline distributed_data_parallel::last_timeline() const { return impl_->reducer->timeline(); }
std::int64_t distributed_data_parallel::step() const { return impl_->forwards; }
void distributed_data_parallel::set_step(std::int64_t s) {
  if (s < 0) throw error(errc::bad_argument, "distributed_data_parallel::set_step: negative step " + std::to_string(s));
  impl_->forwards = s;
}

}  // namespace troupe::ddp
