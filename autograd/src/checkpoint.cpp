// Checkpoint files (Note [Checkpoint file] in checkpoint.hpp).
#include "troupe/autograd/checkpoint.hpp"

#include <array>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include <boost/archive/binary_oarchive.hpp>
#include <boost/serialization/map.hpp>
#include <boost/serialization/string.hpp>

#include "troupe/tensors/boost_tensor.hpp"
#include "troupe/tensors/bounded_archive.hpp"
#include "troupe/tensors/serialization.hpp"

namespace troupe {

namespace {

constexpr std::array<char, 8> magic = {'T', 'R', 'P', 'C', 'K', 'P', 'T', '\0'};
constexpr std::size_t header_size = 8 + 4 + 8 + 8;

std::uint64_t fnv1a64(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

template <class T>
void put_le(std::string& out, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

template <class T>
T get_le(std::string_view in, std::size_t at) {
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<T>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

[[noreturn]] void corrupt(const std::string& source, const std::string& what) {
  throw error(errc::checkpoint_corrupt, source + ": " + what);
}

}  // namespace

std::string encode_checkpoint(const checkpoint_state& st) {
  std::ostringstream payload_stream(std::ios::binary);
  {
    boost::archive::binary_oarchive ar(payload_stream);
    const std::uint64_t seed = st.gen.seed(), offset = st.gen.offset();
    const std::int64_t step = st.step;
    ar << st.model << st.optimizer << step << seed << offset;
  }
  const std::string payload = std::move(payload_stream).str();
  std::string out(magic.begin(), magic.end());
  out.reserve(header_size + payload.size());
  put_le<std::uint32_t>(out, checkpoint_format_version);
  put_le<std::uint64_t>(out, payload.size());
  put_le<std::uint64_t>(out, fnv1a64(payload));
  out += payload;
  return out;
}

checkpoint_state decode_checkpoint(std::string_view bytes, const std::string& source) {
  if (bytes.size() < header_size)
    corrupt(source, "file of " + std::to_string(bytes.size()) + " bytes is shorter than the checkpoint header");
  if (std::memcmp(bytes.data(), magic.data(), magic.size()) != 0) corrupt(source, "not a Troupe checkpoint (bad magic)");
  const auto version = get_le<std::uint32_t>(bytes, 8);
  if (version != checkpoint_format_version)
    corrupt(source, "unsupported checkpoint version " + std::to_string(version) + " (expected " +
                        std::to_string(checkpoint_format_version) + ")");
  const auto length = get_le<std::uint64_t>(bytes, 12);
  if (length != bytes.size() - header_size)
    corrupt(source, "payload length " + std::to_string(length) + " but the file holds " +
                        std::to_string(bytes.size() - header_size) + " bytes (truncated?)");
  const std::string_view payload = bytes.substr(header_size);
  if (fnv1a64(payload) != get_le<std::uint64_t>(bytes, 20)) corrupt(source, "checksum mismatch");
  checkpoint_state st;
  try {
    std::istringstream in(std::string(payload), std::ios::binary);
    bounded_iarchive ar(*in.rdbuf(), 0, errc::checkpoint_corrupt, source);  // Note [bounded archive]
    std::uint64_t seed = 0, offset = 0;
    ar >> st.model >> st.optimizer >> st.step >> seed >> offset;
    st.gen = generator(seed);
    st.gen.set_offset(offset);
  } catch (const error& e) {
    if (e.code() == errc::checkpoint_corrupt) throw;
    corrupt(source, "bad archive: " + e.message());
  } catch (const std::exception& e) {
    corrupt(source, std::string("bad archive: ") + e.what());
  }
  return st;
}

void save_checkpoint(const std::string& path, const nn::module& model, const optim::optimizer& opt,
                     std::int64_t step, const generator& gen) {
  checkpoint_state st;
  st.model = model.state_dict();
  st.optimizer = opt.state_dict();
  st.step = step;
  st.gen = gen;
  // Encode before opening anything, then write in one go: a failure at any point leaves the
  // previous file untouched (atomic_write_file removes its temporary).
  const std::string bytes = encode_checkpoint(st);
  atomic_write_file(path, [&](std::ostream& os) { os.write(bytes.data(), static_cast<std::streamsize>(bytes.size())); });
}

std::int64_t load_checkpoint(const std::string& path, nn::module& model, optim::optimizer& opt, generator& gen) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error(errc::io_error, "load_checkpoint: cannot open " + path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw error(errc::io_error, "load_checkpoint: error reading " + path);
  checkpoint_state st = decode_checkpoint(bytes, path);
  // Both loads validate before they change anything; the model is loaded first, so keep a copy
  // to put back if the optimizer then rejects its part.
  troupe::state_dict backup;
  for (const auto& [name, t] : model.state_dict()) backup.emplace(name, t.clone());
  model.load_state_dict(st.model, true);
  try {
    opt.load_state_dict(st.optimizer);
  } catch (...) {
    model.load_state_dict(backup, true);
    throw;
  }
  gen = st.gen;
  return st.step;
}

}  // namespace troupe
