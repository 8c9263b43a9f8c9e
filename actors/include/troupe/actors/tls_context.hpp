#pragma once
/// \file tls_context.hpp
/// The loaded certificate, key and CA of a node's mutual TLS (OpenSSL).
///
/// Note [tls]
/// ----------
///
/// With tls_options set, a connection between ranks is TLS 1.2+ with both sides authenticated.
/// Each side presents its certificate and refuses a peer whose certificate does not chain to
/// ca_file. There is no host name check: the job's CA is the authority, ranks are addressed by
/// IP. A refused peer is closed and logged; the listener keeps accepting. TLS protects the bytes
/// on the wire (confidentiality, integrity). It keeps out processes without a certificate of
/// the job's CA. The job token is still checked inside the connection.
/// Covered: every connection of a node with node_options::tls. That is the direct channel, and
/// the CAF port that carries the store, the hellos and the heartbeats (Note [tls relay] in
/// actors/src/tls_relay.hpp). Also covered: the process group's TCP ring and its point-to-point
/// connections (Note [tcp ring]).

#include <memory>
#include <string>

#include "troupe/actors/tls_options.hpp"

struct ssl_ctx_st;

namespace troupe {

/// An OpenSSL context with this process's certificate and key, trusting ca_file, verifying
/// peers on both roles. Immutable once built; shared by connections of any thread.
class tls_context {
 public:
  /// Loads the files. Throws errc::bad_argument when a field is empty. Throws errc::io_error
  /// naming the file that is missing, unreadable, not PEM, or whose key does not match the
  /// certificate.
  explicit tls_context(const tls_options& opts);
  ~tls_context();
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;

  ssl_ctx_st* native() const noexcept { return ctx_; }

 private:
  ssl_ctx_st* ctx_ = nullptr;
};

/// The context of `opts`, or null when TLS is off (see tls_context's constructor for errors).
std::shared_ptr<const tls_context> make_tls_context(const tls_options& opts);

}  // namespace troupe
