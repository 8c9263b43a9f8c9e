#pragma once
// Certificates for the TLS tests, made at test time with OpenSSL: a job CA, another CA, and
// P-256 leaf certificates signed by either. Written to a fresh temp directory, removed at scope exit.

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "troupe/actors/tls_options.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::test {

class tls_test_certs {
 public:
  tls_test_certs() {
    char tmpl[] = "/tmp/troupe-tls-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw error(errc::io_error, "mkdtemp failed");
    dir_ = tmpl;
    issue_ca("ca", "troupe test job CA");
    issue_ca("other_ca", "troupe test other CA");
    issue_leaf("rank", "ca", "troupe rank");
    issue_leaf("intruder", "other_ca", "troupe intruder");
  }
  ~tls_test_certs() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  tls_test_certs(const tls_test_certs&) = delete;
  tls_test_certs& operator=(const tls_test_certs&) = delete;

  std::string path(const std::string& file) const { return dir_ + "/" + file; }
  /// `leaf` ("rank" or "intruder") with its key, trusting `ca` ("ca" or "other_ca").
  tls_options options(const std::string& leaf = "rank", const std::string& ca = "ca") const {
    return {path(leaf + ".crt"), path(leaf + ".key"), path(ca + ".crt")};
  }

 private:
  using key_ptr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
  using cert_ptr = std::unique_ptr<X509, decltype(&X509_free)>;

  static void check(bool ok, const char* what) {
    if (!ok) throw error(errc::io_error, std::string("test certificates: ") + what + " failed");
  }

  cert_ptr make_cert(EVP_PKEY* key, const std::string& cn, X509* issuer, bool ca) {
    cert_ptr x(X509_new(), &X509_free);
    check(x != nullptr, "X509_new");
    X509_set_version(x.get(), 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x.get()), ++serial_);
    X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x.get()), 86400);
    X509_set_pubkey(x.get(), key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(x.get()), "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
    X509_set_issuer_name(x.get(), X509_get_subject_name(issuer != nullptr ? issuer : x.get()));
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer != nullptr ? issuer : x.get(), x.get(), nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, NID_basic_constraints, ca ? "critical,CA:TRUE" : "CA:FALSE");
    check(ext != nullptr && X509_add_ext(x.get(), ext, -1) == 1, "basicConstraints");
    X509_EXTENSION_free(ext);
    return x;
  }

  void write(const std::string& name, EVP_PKEY* key, X509* cert) {
    std::FILE* k = std::fopen(path(name + ".key").c_str(), "w");
    std::FILE* c = std::fopen(path(name + ".crt").c_str(), "w");
    const bool ok = k != nullptr && c != nullptr && PEM_write_PrivateKey(k, key, nullptr, nullptr, 0, nullptr, nullptr) == 1 &&
                    PEM_write_X509(c, cert) == 1;
    if (k != nullptr) std::fclose(k);
    if (c != nullptr) std::fclose(c);
    check(ok, "writing PEM files");
  }

  void issue_ca(const std::string& name, const std::string& cn) {
    key_ptr key(EVP_EC_gen("P-256"), &EVP_PKEY_free);
    check(key != nullptr, "EVP_EC_gen");
    cert_ptr x = make_cert(key.get(), cn, nullptr, true);
    check(X509_sign(x.get(), key.get(), EVP_sha256()) > 0, "X509_sign");
    write(name, key.get(), x.get());
  }

  void issue_leaf(const std::string& name, const std::string& ca, const std::string& cn) {
    std::FILE* kf = std::fopen(path(ca + ".key").c_str(), "r");
    std::FILE* cf = std::fopen(path(ca + ".crt").c_str(), "r");
    check(kf != nullptr && cf != nullptr, "opening the CA");
    key_ptr ca_key(PEM_read_PrivateKey(kf, nullptr, nullptr, nullptr), &EVP_PKEY_free);
    cert_ptr ca_cert(PEM_read_X509(cf, nullptr, nullptr, nullptr), &X509_free);
    std::fclose(kf);
    std::fclose(cf);
    check(ca_key != nullptr && ca_cert != nullptr, "reading the CA");
    key_ptr key(EVP_EC_gen("P-256"), &EVP_PKEY_free);
    check(key != nullptr, "EVP_EC_gen");
    cert_ptr x = make_cert(key.get(), cn, ca_cert.get(), false);
    check(X509_sign(x.get(), ca_key.get(), EVP_sha256()) > 0, "X509_sign");
    write(name, key.get(), x.get());
  }

  std::string dir_;
  long serial_ = 0;
};

}  // namespace troupe::test
