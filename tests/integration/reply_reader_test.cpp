// A thread that reads its remote actor replies itself (Note [caller reads actor replies]).
#include <catch2/catch.hpp>

#include <caf/actor_companion.hpp>
#include <caf/actor_registry.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/message_id.hpp>

#include <atomic>
#include <mutex>
#include <thread>

#include "integration/actor_child.hpp"
#include "troupe/actors/reply_reader.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using namespace troupe::test;

namespace {

// A companion actor that keeps the replies it gets and the thread each arrived on.
struct reply_sink {
  explicit reply_sink(caf::actor_system& sys) : companion(caf::actor_cast<caf::strong_actor_ptr>(sys.spawn<caf::actor_companion>())) {
    self()->on_enqueue([this](caf::mailbox_element_ptr e) {
      if (!e || !e->mid.is_response()) return;
      std::lock_guard<std::mutex> lock(m);
      auto content = e->move_content_to_message();
      if (content.match_elements<std::int32_t>()) value = content.get_as<std::int32_t>(0);
      thread = std::this_thread::get_id();
      got.store(true);
    });
  }
  ~reply_sink() {
    self()->on_enqueue(nullptr);
    companion->home_system->registry().erase(companion->id());  // the remote layer put it there for its replies
    companion.reset();
  }
  caf::actor_companion* self() { return static_cast<caf::actor_companion*>(caf::actor_cast<caf::abstract_actor*>(companion)); }
  void ask(const caf::actor& to, std::int32_t x, std::uint64_t id) {
    to->enqueue(caf::make_mailbox_element(companion, caf::make_message_id(id), {}, caf::make_message(x)), nullptr);
  }
  caf::strong_actor_ptr companion;
  std::mutex m;
  std::int32_t value = 0;
  std::thread::id thread;
  std::atomic<bool> got{false};
};

}  // namespace

TEST_CASE("a thread that reads the replies of a remote actor gets them delivered on itself", "[actors][integration]") {
  port_pipe pipe;
  auto children = troupe::spawn(1, [&pipe](int) { actor_child(pipe); });
  troupe::node n(actor_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  {
    auto echo = troupe::lookup_actor(n, "worker1", "echo", 10s);
    reply_sink sink(n.system());
    troupe::reply_reader reader(n, echo);
    for (std::int32_t i = 0; i < 3; ++i) {
      sink.got.store(false);
      bool sent = false;
      // The request goes out from inside the read: the reading role is this thread's before the
      // reply can come, so only this thread can deliver it.
      const bool read = reader.read_until(
          [&] {
            if (!sent) sink.ask(echo, 41 + i, static_cast<std::uint64_t>(i + 1));
            sent = true;
            return sink.got.load();
          },
          std::chrono::steady_clock::now() + 10s);
      CHECK(read);
      REQUIRE(sink.got.load());
      std::lock_guard<std::mutex> lock(sink.m);
      CHECK(sink.value == 42 + i);
      CHECK(sink.thread == std::this_thread::get_id());
    }
  }
  release_children(n);
  CHECK(children.join(20s));
}

TEST_CASE("a reply reader for a local actor reads nothing and says so at once", "[actors][integration]") {
  troupe::node n(actor_options(0, 1, 0));
  {
    auto local = n.system().spawn(echo_actor);
    troupe::reply_reader reader(n, local);
    int calls = 0;
    CHECK_FALSE(reader.read_until([&] { return ++calls > 100; }, std::chrono::steady_clock::now() + 10s));
    CHECK(calls == 0);
    reader.poke();  // nothing to wake
    caf::anon_send_exit(local, caf::exit_reason::user_shutdown);
  }
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
}
