// The OpenSSL context of a node's mutual TLS (Note [tls]).
#include "troupe/actors/tls_context.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "troupe/tensors/error.hpp"

namespace troupe {

namespace {

std::string openssl_reason() {
  const unsigned long e = ::ERR_get_error();
  ::ERR_clear_error();
  if (e == 0) return "no detail from OpenSSL";
  char buf[256];
  ::ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

void check_readable(const std::string& field, const std::string& path) {
  if (path.empty()) throw error(errc::bad_argument, "tls: " + field + " is empty (cert_file, key_file and ca_file are all required)");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw error(errc::io_error, "tls: cannot read " + field + " '" + path + "': " + std::strerror(errno));
  std::fclose(f);
}

}  // namespace

tls_context::tls_context(const tls_options& o) {
  check_readable("cert_file", o.cert_file);
  check_readable("key_file", o.key_file);
  check_readable("ca_file", o.ca_file);
  ctx_ = ::SSL_CTX_new(::TLS_method());
  if (ctx_ == nullptr) throw error(errc::io_error, "tls: SSL_CTX_new failed: " + openssl_reason());
  try {
    ::SSL_CTX_set_min_proto_version(ctx_, TLS1_2_VERSION);
    ::SSL_CTX_set_num_tickets(ctx_, 0);  // no resumption tickets: nothing unread on one-way sockets
    ::SSL_CTX_set_mode(ctx_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (::SSL_CTX_use_certificate_chain_file(ctx_, o.cert_file.c_str()) != 1)
      throw error(errc::io_error, "tls: cert_file '" + o.cert_file + "' holds no usable PEM certificate: " + openssl_reason());
    if (::SSL_CTX_use_PrivateKey_file(ctx_, o.key_file.c_str(), SSL_FILETYPE_PEM) != 1)
      throw error(errc::io_error, "tls: key_file '" + o.key_file + "' holds no usable PEM private key: " + openssl_reason());
    if (::SSL_CTX_check_private_key(ctx_) != 1)
      throw error(errc::io_error, "tls: key_file '" + o.key_file + "' does not match cert_file '" + o.cert_file + "'");
    if (::SSL_CTX_load_verify_locations(ctx_, o.ca_file.c_str(), nullptr) != 1)
      throw error(errc::io_error, "tls: ca_file '" + o.ca_file + "' holds no usable PEM CA certificate: " + openssl_reason());
    ::SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  } catch (...) {
    ::SSL_CTX_free(ctx_);
    throw;
  }
}

tls_context::~tls_context() { ::SSL_CTX_free(ctx_); }

std::shared_ptr<const tls_context> make_tls_context(const tls_options& opts) {
  if (!opts.enabled()) return nullptr;
  return std::make_shared<const tls_context>(opts);
}

}  // namespace troupe
