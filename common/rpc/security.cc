#include "common/rpc/security.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace tessera {
namespace {

absl::StatusOr<std::string> ReadFlagFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": cannot read '", path, "'"));
  std::stringstream contents;
  contents << in.rdbuf();
  if (contents.str().empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", path, "' is empty"));
  return contents.str();
}

bool IsLoopback(absl::string_view host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Security>> Security::Load(const SecurityOptions& options) {
  std::shared_ptr<Security> security(new Security());
  security->insecure_ = options.insecure;
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together: give both, or neither");
  }
  if (!options.tls_cert.empty()) {
    auto cert = ReadFlagFile(options.tls_cert, "tls_cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadFlagFile(options.tls_key, "tls_key");
    if (!key.ok()) return key.status();
    security->cert_ = std::move(*cert);
    security->key_ = std::move(*key);
    security->cert_file_ = options.tls_cert;
    security->key_file_ = options.tls_key;
  }
  if (!options.tls_ca.empty()) {
    auto ca = ReadFlagFile(options.tls_ca, "tls_ca");
    if (!ca.ok()) return ca.status();
    security->ca_ = std::move(*ca);
  }
  if (!options.token_file.empty()) {
    auto contents = ReadFlagFile(options.token_file, "token_file");
    if (!contents.ok()) return contents.status();
    absl::string_view token = *contents;
    token = token.substr(0, token.find('\n'));
    token = absl::StripAsciiWhitespace(token);
    if (token.size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat("--token_file: the token in '", options.token_file,
                                                     "' is shorter than 16 characters"));
    }
    struct stat info;
    if (stat(options.token_file.c_str(), &info) == 0 && (info.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
      LOG(WARNING) << "--token_file: " << options.token_file << " can be read by other users (chmod 600 it)";
    }
    security->token_ = std::string(token);
    security->bearer_ = absl::StrCat("Bearer ", token);
  }
  return std::shared_ptr<const Security>(std::move(security));
}

std::shared_ptr<const Security> Security::Plaintext() {
  static const std::shared_ptr<const Security> plaintext(new Security());
  return plaintext;
}

std::shared_ptr<grpc::ChannelCredentials> Security::ChannelCredentials() const {
  if (!tls() && ca_.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ca_;  // empty: the system's roots
  options.pem_private_key = key_;
  options.pem_cert_chain = cert_;
  return grpc::SslCredentials(options);
}

std::shared_ptr<grpc::ServerCredentials> Security::ServerCredentials() const {
  if (!tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(ca_.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                        : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = ca_;
  options.pem_key_cert_pairs.push_back({key_, cert_});
  return grpc::SslServerCredentials(options);
}

absl::Status Security::CheckListenHost(absl::string_view host, absl::string_view daemon) const {
  if (tls() || IsLoopback(host)) return absl::OkStatus();
  if (!insecure_) {
    return absl::FailedPreconditionError(absl::StrCat(
        daemon, ": refusing to serve plaintext on ", host, ", which is not a loopback address: give --tls_cert and ",
        "--tls_key (and --tls_ca for mutual TLS), or --insecure to accept that anyone on the network can read ",
        "and forge this job's traffic"));
  }
  LOG(WARNING) << daemon << ": serving plaintext on " << host << " (--insecure): traffic can be read and forged";
  return absl::OkStatus();
}

void Security::Authorize(grpc::ClientContext& context) const {
  if (!bearer_.empty()) context.AddMetadata(kAuthorizationHeader, bearer_);
}

absl::Status Security::Authenticate(const grpc::ServerContextBase& context) const {
  if (bearer_.empty()) return absl::OkStatus();
  return AuthenticateHeader(ClientMetadata(context, kAuthorizationHeader));
}

absl::Status Security::AuthenticateHeader(absl::string_view authorization) const {
  if (bearer_.empty()) return absl::OkStatus();
  if (authorization.empty()) return absl::UnauthenticatedError("this job needs its token: the call carried none");
  if (!SecretsEqual(authorization, bearer_)) return absl::UnauthenticatedError("wrong job token");
  return absl::OkStatus();
}

std::string NewSecret() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) LOG(FATAL) << "no randomness for a secret";
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

std::string KeyDigest(absl::string_view key) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

bool SecretsEqual(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::string_view ClientMetadata(const grpc::ServerContextBase& context, absl::string_view key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(grpc::string_ref(key.data(), key.size()));
  if (it == metadata.end()) return {};
  return absl::string_view(it->second.data(), it->second.size());
}

absl::Status CheckSecret(absl::string_view presented, absl::string_view expected, absl::string_view what) {
  if (presented.empty()) return absl::UnauthenticatedError(absl::StrCat(what, ": the call carried no key"));
  if (!SecretsEqual(presented, expected)) return absl::UnauthenticatedError(absl::StrCat(what, ": wrong key"));
  return absl::OkStatus();
}

}  // namespace tessera
