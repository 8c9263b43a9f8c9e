#pragma once
/// \file tls_options.hpp
/// Where a node's TLS certificate, key and trusted CA live (Note [tls] in tls_context.hpp).

#include <string>

namespace troupe {

/// PEM files of mutual TLS. All three empty: TLS off. Otherwise all three are required.
struct tls_options {
  /// This process's certificate (chain), PEM. Env: TROUPE_TLS_CERT.
  std::string cert_file;
  /// The private key of cert_file, PEM, unencrypted. Env: TROUPE_TLS_KEY.
  std::string key_file;
  /// The job's CA certificate(s), PEM: a peer must present a certificate it signed. Env: TROUPE_TLS_CA.
  std::string ca_file;

  bool enabled() const noexcept { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

}  // namespace troupe
