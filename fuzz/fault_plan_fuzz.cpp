// Harness: the fault-plan parser (troupe/actors/fault_plan.hpp, Note [fault plan]).
// Input: the plan's text.
// Beyond "no crash": a parsed plan reads back equal from its to_string(), and an injector of it
// decides a few requests and responses of every rule's key.
#include "fuzz_input.hpp"
#include "troupe/actors/fault_plan.hpp"

namespace {

bool same(const troupe::fault_rule& a, const troupe::fault_rule& b) {
  return a.match == b.match && a.fail_first == b.fail_first && a.drop == b.drop && a.drop_reply == b.drop_reply &&
         a.duplicate == b.duplicate && a.delay_min == b.delay_min && a.delay_max == b.delay_max && a.reorder == b.reorder;
}

bool same(const troupe::fault_plan& a, const troupe::fault_plan& b) {
  if (a.seed != b.seed || a.rules.size() != b.rules.size()) return false;
  for (std::size_t i = 0; i < a.rules.size(); ++i)
    if (!same(a.rules[i], b.rules[i])) return false;
  return true;
}

void decide(const troupe::fault_plan& plan) {
  troupe::fault_injector injector(plan);
  for (const auto& rule : plan.rules) {
    for (std::uint64_t id = 0; id < 3; ++id) {
      troupe::envelope request{troupe::message_kind::rpc_request, "a", "b", id, rule.match, {}, {}};
      const auto d = injector.on_send(request);
      troupe::fuzz::require(d.copies >= 0 && d.copies <= 2 && d.delay.count() >= 0, "an injector decided nonsense");
      troupe::envelope response{troupe::message_kind::rpc_response, "b", "a", id, {}, {}, {}};
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
