// Harness: the fault-plan parser (troupe/actors/fault_plan.hpp, Note [fault plan]).
// Input: the plan's text.
// Beyond "no crash": a parsed plan reads back equal from its to_string() (rules, partitions, kill
// and pause events). An injector of it decides a few requests and responses of every rule's key,
// and a message across its first partition. Kill and pause events are parsed, never fired.
#include "fuzz_input.hpp"
#include "troupe/actors/fault_plan.hpp"

namespace {

bool same(const troupe::fault_rule& a, const troupe::fault_rule& b) {
  return a.match == b.match && a.fail_first == b.fail_first && a.drop == b.drop && a.drop_reply == b.drop_reply &&
         a.duplicate == b.duplicate && a.delay_min == b.delay_min && a.delay_max == b.delay_max && a.reorder == b.reorder;
}

bool same(const troupe::fault_partition& a, const troupe::fault_partition& b) {
  return a.side_a == b.side_a && a.side_b == b.side_b && a.duration == b.duration && a.hold == b.hold;
}

bool same(const troupe::fault_point_event& a, const troupe::fault_point_event& b) {
  return a.action == b.action && a.point == b.point && a.step == b.step && a.worker == b.worker && a.duration == b.duration;
}

template <class T>
bool same_all(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return true;
}

bool same(const troupe::fault_plan& a, const troupe::fault_plan& b) {
  return a.seed == b.seed && same_all(a.rules, b.rules) && same_all(a.partitions, b.partitions) && same_all(a.points, b.points);
}

void decide(const troupe::fault_plan& plan) {
  troupe::fault_injector injector(plan);
  for (const auto& rule : plan.rules) {
    for (std::uint64_t id = 0; id < 3; ++id) {
      troupe::envelope request{troupe::message_kind::rpc_request, "a", "b", id, rule.match, {}, {}};
      const auto d = injector.on_send(request);
      troupe::fuzz::require(d.copies >= 0 && d.copies <= 2 && d.delay.count() >= 0, "an injector decided nonsense");
      troupe::envelope response{troupe::message_kind::rpc_response, "b", "a", id, {}, {}, {}};
      if (!plan.partitions.empty()) {  // a message across the first cut (kill and pause events are never fired here)
        troupe::envelope cut{troupe::message_kind::actor_message, plan.partitions[0].side_a[0], plan.partitions[0].side_b[0], id, {}, {}, {}};
        const auto c = injector.on_send(cut);
        troupe::fuzz::require(c.copies >= 0 && c.copies <= 2 && c.delay.count() >= 0, "an injector decided nonsense across a cut");
      }
      (void)injector.on_receive(request);
      (void)injector.on_send(response);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  troupe::fault_plan plan;
  bool parsed = false;
  troupe::fuzz::refused_ok([&] {
    plan = troupe::fault_plan::parse(std::string(reinterpret_cast<const char*>(data), size));
    parsed = true;
  });
  if (!parsed) return 0;
  troupe::fault_plan back;
  try {
    back = troupe::fault_plan::parse(plan.to_string());
  } catch (const troupe::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    troupe::fuzz::require(false, "a parsed plan's to_string() does not parse");
  }
  troupe::fuzz::require(same(plan, back), "a parsed plan's to_string() reads back different");
  decide(plan);
  return 0;
}
