// Job-wide checkpoints (Note [Job checkpoint] in checkpointer.hpp).
#include "troupe/ddp/checkpointer.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "troupe/autograd/checkpoint.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/serialization.hpp"

namespace troupe::ddp {

namespace {

constexpr std::size_t max_manifest_bytes = 64 * 1024;
constexpr std::size_t part_header_bytes = 28;  // Note [Checkpoint file]
constexpr const char* manifest_magic = "troupe-job-checkpoint 1";

std::string part_name(int rank) { return "rank-" + std::to_string(rank) + ".part"; }

std::uint64_t payload_checksum(std::string_view file_bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(file_bytes[20 + i])) << (8 * i);
  return v;
}

// Reads at most `limit` bytes of `path`; nullopt when it cannot be opened or is longer.
std::optional<std::string> read_bounded(const std::filesystem::path& path, std::uintmax_t limit) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size > limit) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string bytes(static_cast<std::size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (static_cast<std::uintmax_t>(in.gcount()) != size) return std::nullopt;
  return bytes;
}

// The step of a directory named step-NNNNNNNN, or -1.
std::int64_t step_of(const std::filesystem::path& p) {
  const std::string n = p.filename().string();
  if (n.size() != 13 || n.rfind("step-", 0) != 0) return -1;
  if (!std::all_of(n.begin() + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stoll(n.substr(5));
}

// Why `dir` is not a complete checkpoint of `step` for `world` ranks; empty when it is.
std::string incomplete_reason(const std::filesystem::path& dir, std::int64_t step, int world) {
  const auto text = read_bounded(dir / "MANIFEST", max_manifest_bytes);
  if (!text) return "MANIFEST is missing, unreadable or over 64 KiB";
  std::istringstream in(*text);
  std::string line, word;
  std::int64_t s = -1;
  int w = -1;
  if (!std::getline(in, line) || line != manifest_magic) return "MANIFEST has no header line";
  if (!(in >> word >> s) || word != "step" || s != step) return "MANIFEST names another step";
  if (!(in >> word >> w) || word != "world" || w != world)
    return "MANIFEST is for " + std::to_string(w) + " ranks, the job has " + std::to_string(world);
  for (int r = 0; r < world; ++r) {
    int pr = -1;
    std::uint64_t bytes = 0, sum = 0;
    if (!(in >> word >> pr >> bytes >> sum) || word != "part" || pr != r) return "MANIFEST is torn at part " + std::to_string(r);
    const auto path = dir / part_name(r);
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) return part_name(r) + " is missing";
    if (size != bytes || size < part_header_bytes) return part_name(r) + " has " + std::to_string(size) + " bytes, not " + std::to_string(bytes);
    const auto part = read_bounded(path, bytes);
    if (!part) return part_name(r) + " cannot be read";
    if (payload_checksum(*part) != sum) return part_name(r) + " has another checksum";
    try {
      if (decode_checkpoint(*part, path.string()).step != step) return part_name(r) + " holds another step";
    } catch (const error& e) {
      return e.message();
    }
  }
  if (in >> word) return "MANIFEST has trailing data";
  return {};
}

}  // namespace

checkpointer::checkpointer(process_group& group, checkpointer_options opts) : group_(group), opts_(std::move(opts)) {
  if (opts_.dir.empty()) throw error(errc::bad_argument, "checkpointer: the directory is empty");
  if (opts_.every < 1) throw error(errc::bad_argument, "checkpointer: every must be >= 1, got " + std::to_string(opts_.every));
  if (opts_.keep < 1) throw error(errc::bad_argument, "checkpointer: keep must be >= 1, got " + std::to_string(opts_.keep));
}

void checkpointer::track(const std::string& name, nn::module& m) { modules_.emplace_back(name, &m); }
void checkpointer::track(const std::string& name, optim::optimizer& opt) { optimizers_.emplace_back(name, &opt); }
void checkpointer::track(const std::string& name, generator& gen) { generators_.emplace_back(name, &gen); }
void checkpointer::track(const std::string& name, std::int64_t& value) { counters_.emplace_back(name, &value); }

std::filesystem::path checkpointer::step_dir(std::int64_t step) const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return opts_.dir / buf;
}

// Every tracked item under "<kind>/<name>/...": one state dict for the part file.
state_dict checkpointer::collect() const {
  state_dict all;
  for (const auto& [name, m] : modules_)
    for (auto& [k, t] : m->state_dict()) all.emplace("module/" + name + "/" + k, t);
  for (const auto& [name, o] : optimizers_)
    for (auto& [k, t] : o->state_dict()) all.emplace("optimizer/" + name + "/" + k, t);
  for (const auto& [name, g] : generators_)
    all.emplace("generator/" + name,
                from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(g->seed()), static_cast<std::int64_t>(g->offset())}));
  for (const auto& [name, v] : counters_) all.emplace("counter/" + name, from_vector(std::vector<std::int64_t>{*v}));
  return all;
}

// The entries of `all` under `prefix`, with the prefix removed.
static state_dict under(const state_dict& all, const std::string& prefix) {
  state_dict out;
  for (auto it = all.lower_bound(prefix); it != all.end() && it->first.rfind(prefix, 0) == 0; ++it)
    out.emplace(it->first.substr(prefix.size()), it->second);
  return out;
}

static const tensor& entry(const state_dict& all, const std::string& key, std::int64_t numel) {
  const auto it = all.find(key);
  if (it == all.end() || it->second.dtype() != dtype::int64 || it->second.numel() != numel)
    throw error(errc::checkpoint_corrupt, "checkpointer: the part has no valid entry '" + key + "'");
  return it->second;
}

void checkpointer::apply(const state_dict& all) {
  for (const auto& [name, g] : generators_) entry(all, "generator/" + name, 2);
  for (const auto& [name, v] : counters_) entry(all, "counter/" + name, 1);
  for (const auto& [name, m] : modules_) m->load_state_dict(under(all, "module/" + name + "/"), true);
  for (const auto& [name, o] : optimizers_) o->load_state_dict(under(all, "optimizer/" + name + "/"));
  for (const auto& [name, g] : generators_) {
    const auto* p = entry(all, "generator/" + name, 2).data<std::int64_t>();
    *g = generator(static_cast<std::uint64_t>(p[0]));
    g->set_offset(static_cast<std::uint64_t>(p[1]));
  }
  for (const auto& [name, v] : counters_) *v = entry(all, "counter/" + name, 1).data<std::int64_t>()[0];
}

std::int64_t checkpointer::pick_complete_step() const {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(opts_.dir, ec))
    if (const auto s = step_of(e.path()); s >= 0 && e.is_directory()) steps.push_back(s);
  std::sort(steps.rbegin(), steps.rend());
  for (const auto s : steps) {
    const std::string why = incomplete_reason(step_dir(s), s, group_.world_size());
    if (why.empty()) return s;
    std::fprintf(stderr, "checkpointer: ignoring the incomplete checkpoint %s: %s\n", step_dir(s).c_str(), why.c_str());
  }
  return -1;
}

std::int64_t checkpointer::restore() {
  tensor chosen = from_vector(std::vector<std::int64_t>{-1});
  if (group_.rank() == 0) {
    std::filesystem::create_directories(opts_.dir);
    chosen.data<std::int64_t>()[0] = pick_complete_step();
  }
  group_.broadcast(chosen, 0).wait(opts_.timeout);
  const std::int64_t step = chosen.data<std::int64_t>()[0];
  if (step < 0) return 0;
  const auto path = step_dir(step) / part_name(group_.rank());
  const auto bytes = read_bounded(path, std::uintmax_t{1} << 40);
  if (!bytes) throw error(errc::io_error, "checkpointer: cannot read " + path.string());
  const checkpoint_state st = decode_checkpoint(*bytes, path.string());
  if (st.step != step) throw error(errc::checkpoint_corrupt, path.string() + ": holds step " + std::to_string(st.step));
  apply(st.model);
  part_bytes_ = bytes->size();
  return step;
}

bool checkpointer::maybe_save(std::int64_t step) {
  if (step % opts_.every != 0) return false;
  save(step);
  return true;
}

void checkpointer::save(std::int64_t step) {
  group_.fault_point("checkpoint", step);
  checkpoint_state st;
  st.model = collect();
  st.step = step;
  const std::string bytes = encode_checkpoint(st);
  const auto dir = step_dir(step);
  std::filesystem::create_directories(dir);
  const auto path = dir / part_name(group_.rank());
  atomic_write_file(path.string(), [&](std::ostream& os) { os.write(bytes.data(), static_cast<std::streamsize>(bytes.size())); });
  part_bytes_ = bytes.size();
  if (opts_.after_part_written) opts_.after_part_written(step);
  const tensor mine = from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(bytes.size()),
                                                            static_cast<std::int64_t>(payload_checksum(bytes))});
  tensor all = zeros({2 * static_cast<std::int64_t>(group_.world_size())}, {dtype::int64});
  group_.allgather(all, mine).wait(opts_.timeout);
  if (group_.rank() != 0) return;
  const std::int64_t* p = all.data<std::int64_t>();
  write_manifest(step, std::vector<std::int64_t>(p, p + all.numel()));
  prune(step);
}

void checkpointer::write_manifest(std::int64_t step, const std::vector<std::int64_t>& info) const {
  std::ostringstream m;
  m << manifest_magic << "\nstep " << step << "\nworld " << group_.world_size() << "\n";
  for (int r = 0; r < group_.world_size(); ++r)
    m << "part " << r << " " << static_cast<std::uint64_t>(info[2 * r]) << " " << static_cast<std::uint64_t>(info[2 * r + 1]) << "\n";
  const std::string text = m.str();
  atomic_write_file((step_dir(step) / "MANIFEST").string(),
                    [&](std::ostream& os) { os.write(text.data(), static_cast<std::streamsize>(text.size())); });
}

// Removes complete checkpoints older than the `keep` newest; incomplete older ones go too.
void checkpointer::prune(std::int64_t newest) const {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(opts_.dir, ec))
    if (const auto s = step_of(e.path()); s >= 0 && s <= newest) steps.push_back(s);
  std::sort(steps.rbegin(), steps.rend());
  int kept = 0;
  for (const auto s : steps) {
    const bool complete = incomplete_reason(step_dir(s), s, group_.world_size()).empty();
    if (complete && kept < opts_.keep) {
      ++kept;
      continue;
    }
    if (kept >= opts_.keep || !complete) std::filesystem::remove_all(step_dir(s), ec);
  }
}

}  // namespace troupe::ddp
