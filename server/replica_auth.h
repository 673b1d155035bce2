// How a backup knows that a chunk state comes from the chunk's primary, without either learning a secret of the
// other. Each server makes an Ed25519 key pair at start-up and registers the public half
// (RegisterRequest.replication_key); the cluster view carries it (ServerInfo.replication_key). A primary signs
// every Replicate call for one backup; the backup checks the signature with the primary's public key from its
// own view. Nothing a backup receives lets it act as the primary toward anyone (member keys never travel
// between servers).
//
// What is signed (ReplicateProof): a fixed label, the SHA-256 of the call's units (ReplicateDigest: epoch, primary
// id, state, updates of each: everything the backup takes), and the backup's id and incarnation, so a call made
// for one backup is refused by every other. One signature covers every unit of a call (ReplicateBatch).
//
//   ReplicaSigner signer = *ReplicaSigner::Generate();
//   request.set_...;  // the whole request first
//   std::string signature = signer.Sign(ReplicateProof(ReplicateDigest(request), backup_id, backup_incarnation));
//   // the backup:
//   bool ok = VerifyReplicaSignature(view_key_of_primary, ReplicateProof(ReplicateDigest(request), self, inc),
//                                    signature);
#ifndef TESSERA_SERVER_REPLICA_AUTH_H_
#define TESSERA_SERVER_REPLICA_AUTH_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/ps.pb.h"

namespace tessera {

// Binary metadata carrying a Replicate call's signature (gRPC wants "-bin" for bytes).
inline constexpr char kReplicaSignatureHeader[] = "tessera-replica-signature-bin";
// Sizes of an Ed25519 public key and signature.
inline constexpr size_t kReplicationKeyBytes = 32;
inline constexpr size_t kReplicaSignatureBytes = 64;

// A server's signing key. Immutable after Generate; thread-safe.
class ReplicaSigner {
 public:
  // A fresh key pair. INTERNAL when OpenSSL cannot make one.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ReplicaSigner>> Generate();
  ~ReplicaSigner();
  ReplicaSigner(const ReplicaSigner&) = delete;
  ReplicaSigner& operator=(const ReplicaSigner&) = delete;

  // The public key (kReplicationKeyBytes), for the registration.
  const std::string& public_key() const { return public_key_; }
  // The signature of `message` (kReplicaSignatureBytes); empty only when OpenSSL fails (the backup refuses it).
  std::string Sign(absl::string_view message) const;

 private:
  struct Key;
  explicit ReplicaSigner(std::unique_ptr<Key> key, std::string public_key);
  const std::unique_ptr<Key> key_;
  const std::string public_key_;
};

// SHA-256 over the batch's units, each as its length (64 bits, little-endian) and its deterministic
// serialization: computed and signed once per call. The digest of one request is that of a batch holding it alone.
std::string ReplicateDigest(const tessera::v1::ReplicateBatch& batch);
std::string ReplicateDigest(const tessera::v1::ReplicateRequest& request);
// The bytes signed for backup `backup_id` (incarnation `backup_incarnation`) of a request with `digest`.
std::string ReplicateProof(absl::string_view digest, int backup_id, uint64_t backup_incarnation);
// Whether `signature` is `public_key`'s signature of `message`. False for keys or signatures of another size.
bool VerifyReplicaSignature(absl::string_view public_key, absl::string_view message, absl::string_view signature);

// Every number of a Replicate call within common/wire_limits.h, checked before anything is taken from it: the
// epoch (kMaxEpoch), the primary's id (within `num_servers`), the state's version, update and assignment counts
// (0 .. kMaxUpdateCount, the counts not above the version), its clocks (0 .. kMaxClock, one per worker at most),
// its sequence table (workers within `num_workers`, numbers 1 .. kMaxUpdateCount), and the updates (versions
// consecutive and ending at the state's, clocks within 0 .. kMaxClock, finite scales). INVALID_ARGUMENT naming
// the field otherwise.
[[nodiscard]] absl::Status CheckReplicateRequest(const tessera::v1::ReplicateRequest& request, int num_servers,
                                                 int num_workers);

}  // namespace tessera

#endif  // TESSERA_SERVER_REPLICA_AUTH_H_
