// Who may talk to a Tessera daemon, and over what: TLS (mutual with a CA on both sides), the job token, and
// the per-member keys that tie a call to the member it claims to come from.
//
//   Job token     A secret read from a file (--token_file), the same for every member of a job. Every RPC
//                 carries it ("authorization: Bearer TOKEN"); a call without it or with another is
//                 UNAUTHENTICATED and changes nothing.
//   Member key    Issued by the scheduler to each worker and server at registration (RegisterResponse
//                 .member_key). A call that acts for a member (heartbeat, clock, report, done, declare; a push)
//                 carries it in "tessera-member-key": nobody can act for another rank.
//   Control key   Made by each server at start-up and given only to the scheduler (RegisterRequest
//                 .control_key): the server's control RPCs (AssignShards, Checkpoint, DecideRounds, Shutdown)
//                 need it, so only the scheduler can move shards or stop a server.
//
// Without a token file the token check is off (loopback development); member and control keys are always on.
#ifndef TESSERA_COMMON_RPC_SECURITY_H_
#define TESSERA_COMMON_RPC_SECURITY_H_

#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/rpc/security_options.h"

namespace tessera {

// The metadata keys (lower case, as HTTP/2 wants them).
inline constexpr char kAuthorizationHeader[] = "authorization";
inline constexpr char kMemberKeyHeader[] = "tessera-member-key";
inline constexpr char kControlKeyHeader[] = "tessera-control-key";

// Immutable once loaded; shared by every channel and server of a process.
class Security {
 public:
  // Reads the files. INVALID_ARGUMENT naming the flag for a missing, unreadable or empty file, or a cert without
  // a key (or the other way round).
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<const Security>> Load(const SecurityOptions& options);
  // Plaintext, no token: tests and loopback development.
  static std::shared_ptr<const Security> Plaintext();

  bool tls() const { return !cert_.empty(); }
  bool mutual_tls() const { return tls() && !ca_.empty(); }
  bool has_token() const { return !token_.empty(); }
  // PEM contents, for the HTTP endpoint.
  const std::string& cert_pem() const { return cert_; }
  const std::string& key_pem() const { return key_; }
  const std::string& ca_pem() const { return ca_; }
  const std::string& cert_file() const { return cert_file_; }
  const std::string& key_file() const { return key_file_; }

  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;

  // OK for a loopback host, or with TLS, or with --insecure (a warning is logged then). FAILED_PRECONDITION
  // saying what to do otherwise.
  [[nodiscard]] absl::Status CheckListenHost(absl::string_view host, absl::string_view daemon) const;

  // Client side: the job token on `context`.
  void Authorize(grpc::ClientContext& context) const;
  // The authorization header's value that Authorize sends (empty without a token), for transports without
  // gRPC's metadata.
  const std::string& authorization() const { return bearer_; }
  // Server side: OK when the call carries the job token (always, when there is none). UNAUTHENTICATED otherwise.
  [[nodiscard]] absl::Status Authenticate(const grpc::ServerContextBase& context) const;
  // The same for an HTTP request's Authorization header.
  [[nodiscard]] absl::Status AuthenticateHeader(absl::string_view authorization) const;

 private:
  Security() = default;

  std::string cert_;
  std::string key_;
  std::string cert_file_;
  std::string key_file_;
  std::string ca_;
  std::string token_;
  std::string bearer_;  // "Bearer TOKEN"
  bool insecure_ = false;
};

// 128 random bits as 32 hex digits (member and control keys).
std::string NewSecret();
// SHA-256 of `key` (32 bytes): what servers hold of a worker's member key.
std::string KeyDigest(absl::string_view key);
// Equal, in time independent of where they differ.
bool SecretsEqual(absl::string_view a, absl::string_view b);
// The value of metadata `key` sent by the client; empty when absent.
absl::string_view ClientMetadata(const grpc::ServerContextBase& context, absl::string_view key);
// UNAUTHENTICATED naming `what` unless `presented` equals `expected` (a missing key included).
[[nodiscard]] absl::Status CheckSecret(absl::string_view presented, absl::string_view expected, absl::string_view what);

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_SECURITY_H_
