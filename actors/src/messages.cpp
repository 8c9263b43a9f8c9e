#include "troupe/actors/messages.hpp"

#include <caf/actor_system_config.hpp>

#include "rref/protocol.hpp"
#include "troupe/actors/error_caf.hpp"

namespace troupe {

void register_messages(caf::actor_system_config& cfg) {
  cfg.add_message_type<worker_info>("troupe.worker_info");
  cfg.add_message_type<shm_probe>("troupe.shm_probe");
  cfg.add_message_type<shm_verdict>("troupe.shm_verdict");
  cfg.add_message_type<hello>("troupe.hello");
  cfg.add_message_type<hello_ack>("troupe.hello_ack");
  cfg.add_message_type<rpc_request>("troupe.rpc_request");
  cfg.add_message_type<rpc_response>("troupe.rpc_response");
  cfg.add_message_type<std::vector<char>>("troupe.bytes");
  cfg.add_message_type<std::vector<std::string>>("troupe.strings");
  cfg.add_message_type<store_set>("troupe.store_set");
  cfg.add_message_type<store_get>("troupe.store_get");
  cfg.add_message_type<store_add>("troupe.store_add");
  cfg.add_message_type<store_wait>("troupe.store_wait");
  cfg.add_message_type<store_cas>("troupe.store_cas");
  cfg.add_message_type<store_erase>("troupe.store_erase");
  cfg.add_message_type<store_num_keys>("troupe.store_num_keys");
  cfg.add_message_type<store_barrier>("troupe.store_barrier");
  // The RRef protocol's cross-process messages (actors/src/rref/protocol.hpp).
  cfg.add_message_type<rref_id>("troupe.rref_id");
  cfg.add_message_type<fork_id>("troupe.fork_id");
  cfg.add_message_type<rref_msg::remote_call>("troupe.rref.remote_call");
  cfg.add_message_type<rref_msg::fork_request>("troupe.rref.fork_request");
  cfg.add_message_type<rref_msg::child_ack>("troupe.rref.child_ack");
  cfg.add_message_type<rref_msg::user_delete>("troupe.rref.user_delete");
  cfg.add_message_type<rref_msg::user_delete_batch>("troupe.rref.user_delete_batch");
  cfg.add_message_type<rref_msg::fork_probe>("troupe.rref.fork_probe");
  cfg.add_message_type<rref_msg::answer>("troupe.rref.answer");
  cfg.add_message_type<rref_msg::fetch>("troupe.rref.fetch");
  cfg.add_message_type<rref_msg::value_ready>("troupe.rref.value_ready");
  cfg.add_message_type<rref_msg::fetch_answer>("troupe.rref.fetch_answer");
  register_error_category(cfg);
}

}  // namespace troupe
