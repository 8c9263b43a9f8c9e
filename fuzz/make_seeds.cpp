// troupe_fuzz_seeds DIR: writes a seed corpus for every harness of fuzz/ into DIR/<harness>/,
// made by the project's own encoders (so the seeds follow the formats as they are). The corpora
// committed under fuzz/corpus/ are its output; `make fuzz` runs it again into the build folder.
#include <unistd.h>

#include <boost/serialization/vector.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/scoped_actor.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "actor_system_fixture.hpp"
#include "rpc/fragment.hpp"
#include "rpc/split_frame.hpp"
#include "rpc/wire.hpp"
#include "safetensors_json.hpp"
#include "troupe/actors/fault_plan.hpp"
#include "troupe/actors/rpc/codec.hpp"
#include "troupe/autograd/checkpoint.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/safetensors.hpp"
#include "troupe/tensors/serialization.hpp"

namespace {

namespace fs = std::filesystem;
using namespace troupe;
using bytes = std::vector<char>;

struct sample {  // the codec harness's user struct
  std::string label;
  std::vector<double> values;
  template <class Archive>
  void serialize(Archive& ar, unsigned) {
    ar & label & values;
  }
};

fs::path out_dir;

void write(const std::string& harness, const std::string& name, std::uint8_t selector, const bytes& body, bool with_selector = true) {
  fs::create_directories(out_dir / harness);
  std::ofstream f(out_dir / harness / name, std::ios::binary);
  if (with_selector) f.put(static_cast<char>(selector));
  f.write(body.data(), static_cast<std::streamsize>(body.size()));
  if (!f) throw std::runtime_error("cannot write " + (out_dir / harness / name).string());
}

bytes file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(f), {});
}

state_dict small_state() {
  return {{"bias", from_vector<float>({0.5f, -1.0f})},
          {"steps", from_vector<std::int64_t>({7})},
          {"weight", from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3})}};
}

rpc_request small_request(std::size_t payload) {
  rpc_request r{42, "echo", "worker0", bytes(payload, 'p'), bytes{1, 2}};
  return r;
}

template <class T>
bytes body_of(T msg, detail::frame_kind kind) {
  bytes frame;
  detail::append_frame(frame, kind, msg);
  return bytes(frame.begin() + detail::frame_header_size, frame.end());
}

void frame_seeds() {
  write("frame", "request", 0, body_of(small_request(16), detail::frame_kind::request));
  write("frame", "request-empty", 0, body_of(rpc_request{}, detail::frame_kind::request));
  write("frame", "response", 1, body_of(rpc_response{7, 0, "", bytes(24, 'r'), {}}, detail::frame_kind::response));
  write("frame", "response-error", 1, body_of(rpc_response{7, 11, "bad frame", {}, bytes{9}}, detail::frame_kind::response));
  write("frame", "auth", 2, body_of(detail::channel_auth{"worker1", std::string(64, 'f'), true}, detail::frame_kind::auth));
}

// A whole frame of `body` as fragments of at most `piece` bytes (Note [fragments]).
bytes fragments(const bytes& body, detail::frame_kind inner, std::uint32_t stream, std::size_t piece) {
  bytes out;
  for (std::size_t at = 0; at < body.size();) {
    const std::size_t n = std::min(piece, body.size() - at);
    detail::fragment_head h{stream, 0, static_cast<std::uint8_t>(inner), body.size()};
    if (at == 0) h.flags |= detail::fragment_first;
    if (at + n == body.size()) h.flags |= detail::fragment_last;
    unsigned char head[detail::frame_header_size + detail::fragment_head_size];
    detail::write_fragment_head(head, h, n);
    out.insert(out.end(), head, head + sizeof head);
    out.insert(out.end(), body.begin() + static_cast<std::ptrdiff_t>(at), body.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  return out;
}

void fragment_seeds() {
  auto reads = [](std::uint8_t flags, std::uint16_t chunk, const bytes& stream) {
    bytes b{static_cast<char>(chunk & 0xff), static_cast<char>(chunk >> 8)};
    b.insert(b.end(), stream.begin(), stream.end());
    return std::make_pair(flags, b);
  };
  bytes whole;
  rpc_request small = small_request(40);
  detail::append_frame(whole, detail::frame_kind::request, small);
  const bytes req_body = body_of(small_request(300), detail::frame_kind::request);
  bytes two = fragments(req_body, detail::frame_kind::request, 1, 64);
  const bytes other = fragments(body_of(small_request(100), detail::frame_kind::request), detail::frame_kind::request, 2, 50);
  bytes interleaved;  // two streams, one fragment of each in turn, a whole frame between
  for (std::size_t a = 0, b = 0; a < two.size() || b < other.size();) {
    auto take = [](const bytes& from, std::size_t& at, bytes& to) {
      if (at >= from.size()) return;
      const std::size_t len = detail::frame_length(from.data() + at) + detail::frame_header_size;
      to.insert(to.end(), from.begin() + static_cast<std::ptrdiff_t>(at), from.begin() + static_cast<std::ptrdiff_t>(at + len));
      at += len;
    };
    take(two, a, interleaved);
    take(other, b, interleaved);
    interleaved.insert(interleaved.end(), whole.begin(), whole.end());
  }
  const bytes resp = fragments(body_of(rpc_response{3, 0, "", bytes(200, 'x'), {}}, detail::frame_kind::response),
                               detail::frame_kind::response, 9, 80);
  bytes auth;
  detail::channel_auth a{"worker1", std::string(64, 'a'), false};
  detail::append_frame(auth, detail::frame_kind::auth, a);
  bytes authed = auth;
  authed.insert(authed.end(), whole.begin(), whole.end());
  const std::vector<std::pair<std::string, std::pair<std::uint8_t, bytes>>> seeds = {
      {"whole", reads(0, 4095, whole)},
      {"fragments", reads(0, 4095, two)},
      {"fragments-small-reads", reads(2, 30, two)},
      {"interleaved", reads(2, 100, interleaved)},
      {"response-fragments", reads(1, 57, resp)},
      {"auth-then-request", reads(4, 4095, authed)},
  };
  for (const auto& [name, s] : seeds) write("fragment", name, s.first, s.second);
  // One large request (start_frame reads its payload straight into a buffer).
  bytes large;
  rpc_request big = small_request(detail::split_payload_bytes);
  detail::append_frame(large, detail::frame_kind::request, big);
  const auto l = reads(2, 2047, large);
  write("fragment", "large-request", l.first, l.second);
}

void codec_seeds() {
  const tensor t = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const tensor i = from_vector<std::int64_t>({5, -5});
  write("codec", "args-0", 0, rpc::encode_args(std::int32_t{3}, 2.5, std::string("hello")));
  write("codec", "args-1", 1, rpc::encode_args(std::vector<float>{1, 2}, std::map<std::string, std::int64_t>{{"a", 1}, {"b", 2}}));
  write("codec", "args-2", 2, rpc::encode_args(t));
  write("codec", "args-2-undefined", 2, rpc::encode_args(tensor()));
  write("codec", "args-3", 3, rpc::encode_args(t, std::vector<tensor>{i, t}, std::int64_t{9}));
  write("codec", "args-4", 4, rpc::encode_args(std::tuple<int, std::string, double>{1, "x", 0.5},
                                               std::vector<std::vector<std::string>>{{"a"}, {}, {"b", "c"}}));
  write("codec", "args-5", 5, rpc::encode_args(true, std::vector<bool>{true, false}, 'c'));
  write("codec", "args-6", 6, rpc::encode_args(sample{"s", {1.0, 2.0}}, std::pair<std::uint8_t, float>{1, 2.0f}));
  write("codec", "args-7", 7, rpc::encode_args());
  write("codec", "result-8", 8, rpc::encode_result(std::int64_t{-3}));
  write("codec", "result-9", 9, rpc::encode_result(3.25));
  write("codec", "result-10", 10, rpc::encode_result(true));
  write("codec", "result-11", 11, rpc::encode_result(std::string("result")));
  write("codec", "result-12", 12, rpc::encode_result(t));
  write("codec", "result-12-adopted", 12 | 0x80, rpc::encode_result(zeros({64, 300})));
  write("codec", "result-13", 13, rpc::encode_result(std::vector<tensor>{t, tensor(), i}));
  write("codec", "result-14", 14, rpc::encode_result(std::map<std::string, tensor>{{"w", t}}));
  write("codec", "result-15", 15, rpc::encode_result(sample{"label", {3.0}}));
  write("codec", "result-16", 16, rpc::encode_result(std::vector<bool>{false, true, true}));
  write("codec", "result-17", 17, rpc::encode_result(std::tuple<std::int32_t, std::vector<std::uint16_t>, std::string>{1, {2, 3}, "z"}));
}

void file_seeds(const fs::path& tmp) {
  const fs::path p = tmp / "seed.bin";
  save_tensor(from_vector<float>({1, 2, 3, 4}, {2, 2}), p.string());
  write("tensor_file", "tensor", 0, file_bytes(p));
  write("tensor_file", "tensor-fixed", 2, file_bytes(p));
  save_tensor(from_vector<std::int32_t>({}), p.string());
  write("tensor_file", "tensor-empty", 0, file_bytes(p));
  save_state_dict(small_state(), p.string());
  write("tensor_file", "state-dict", 1, file_bytes(p));
  write("tensor_file", "state-dict-fixed", 3, file_bytes(p));

  checkpoint_state st;
  st.model = small_state();
  st.optimizer = {{"momentum.0", from_vector<float>({0.25f, 0.5f})}};
  st.step = 12;
  st.gen = generator(5);
  const std::string ck = encode_checkpoint(st);
  write("checkpoint", "checkpoint", 0, bytes(ck.begin(), ck.end()));
  write("checkpoint", "checkpoint-fixed", 1, bytes(ck.begin(), ck.end()));

  state_dict sd = small_state();
  sd["flags"] = from_vector<std::uint8_t>({1, 0, 1}).to(dtype::boolean);
  sd["half"] = from_vector<float>({1.5f, 2.5f}).to(dtype::float16);
  save_safetensors(sd, p.string(), {{"format", "pt"}, {"note", "a \"quoted\" \\ value\n"}});
  const bytes st_file = file_bytes(p);
  write("safetensors", "file", 1, st_file);
  write("safetensors", "metadata", 2, st_file);
  std::uint64_t n = 0;
  for (int k = 0; k < 8; ++k) n |= static_cast<std::uint64_t>(static_cast<unsigned char>(st_file[static_cast<std::size_t>(k)])) << (8 * k);
  write("safetensors", "header-json", 0, bytes(st_file.begin() + 8, st_file.begin() + 8 + static_cast<std::ptrdiff_t>(n)));
  const std::string json = R"({"a": [1, -2.5e3, true, false, null, {"b": "\u00e9\ud83d\ude00\t"}], "c": {}})";
  write("safetensors", "json", 0, bytes(json.begin(), json.end()));
  fs::remove(p);
}

// Actor frame bodies as remote_actors::forward and send_control write them.
void actor_message_seeds() {
  fuzz::actor_system_fixture f;
  auto body = [&](auto&&... xs) {
    bytes b;
    caf::binary_serializer sink{f.context(), b};
    if (sink(xs...)) throw std::runtime_error("cannot encode an actor message seed");
    return b;
  };
  const std::uint64_t request = caf::make_message_id().integer_value();
  caf::scoped_actor sender{f.system()};  // an actor handle to carry in a message
  auto ptr = caf::actor_cast<caf::strong_actor_ptr>(sender);
  const tensor t = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  write("actor_message", "values", 0, body(caf::actor_id{3}, caf::actor_id{5}, request, caf::make_message(std::int32_t{7}, std::string("hi"), 2.5)));
  write("actor_message", "tensor", 0, body(caf::actor_id{3}, caf::actor_id{5}, request, caf::make_message(t, from_vector<std::int64_t>({1, -1}))));
  write("actor_message", "user-type", 0,
        body(caf::actor_id{0}, caf::actor_id{9}, request, caf::make_message(fuzz::user_message{"grad", {0.5, -1}, t}, std::string("tail"))));
  write("actor_message", "link", 0, body(caf::actor_id{0}, caf::actor_id{5}, request, caf::make_message(caf::link_atom::value, ptr)));
  write("actor_message", "rpc-request", 0,
        body(caf::actor_id{3}, caf::actor_id{5}, request, caf::make_message(small_request(8), std::vector<std::string>{"a", "b"})));
  write("actor_message", "empty", 0, body(caf::actor_id{3}, caf::actor_id{5}, request, caf::message{}));
  write("actor_message", "control-watch", 1, body(std::uint8_t{0}, caf::actor_id{5}, caf::error{}));
  write("actor_message", "control-down", 1, body(std::uint8_t{1}, caf::actor_id{5}, caf::make_error(caf::exit_reason::unknown)));
}

void fault_plan_seeds() {
  const std::vector<std::string> plans = {
      "seed 7\nrule troupe.rref.fork_request fail_first=2 drop=0.1\nrule * delay=1..5 reorder=10\n",
      "# a comment\nseed 0\nrule rpc_response drop_reply=0.5 duplicate=0.25 # trailing\n",
      "rule rpc_request delay=3\nrule echo fail_first=1 drop=1 drop_reply=0 duplicate=1 delay=0..0 reorder=0\n",
      "seed 3\npartition worker0 worker1,worker2 for=500 hold\npartition a b\nrule actor_message drop=0.5\n",
      "kill allreduce step=40 worker=worker1\npause step step=2 for=300\nkill checkpoint step=0\n",
  };
  for (std::size_t i = 0; i < plans.size(); ++i)
    write("fault_plan", "plan-" + std::to_string(i), 0, bytes(plans[i].begin(), plans[i].end()), false);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR (writes DIR/<harness>/<seed>)\n", argv[0]);
    return 2;
  }
  out_dir = argv[1];
  const fs::path tmp = fs::temp_directory_path() / ("troupe_fuzz_seeds." + std::to_string(::getpid()));
  fs::create_directories(tmp);
  try {
    frame_seeds();
    fragment_seeds();
    codec_seeds();
    actor_message_seeds();
    file_seeds(tmp);
    fault_plan_seeds();
  } catch (const std::exception& e) {
    fs::remove_all(tmp);
    std::fprintf(stderr, "troupe_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  fs::remove_all(tmp);
  return 0;
}
