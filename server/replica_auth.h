// How a backup knows that a chunk state comes from the chunk's primary, at the cost of a pass at memory speed.
// Each server makes an X25519 key pair at start-up and registers the public half
// (RegisterRequest.replication_key); the cluster view carries it (ServerInfo.replication_key). A primary and a
// backup each derive, from their own private key and the other's public key in the view, the same 256-bit key for
// hand-overs in that direction (HKDF-SHA256 over the shared secret, bound to both public keys, the primary's id and
// the backup's id and incarnation), and nobody else can: a worker, or another server, holds neither private key.
// Every Replicate call carries an AES-256-GMAC tag of its units under that key (ReplicaCredential). Nothing a
// backup receives lets it act as the primary toward anyone (member keys never travel between servers), and a call
// made for one backup is refused by every other.
//
//   std::shared_ptr<const ReplicaKey> key = *ReplicaKey::Generate();
//   std::string credential = key->Credential(backup_public_key, backup_id, backup_incarnation, batch);
//   // the backup, with its own key and the primary's public key from its view:
//   bool ok = backup_key->Verify(primary_public_key, own_id, own_incarnation, batch, credential);
#ifndef TESSERA_SERVER_REPLICA_AUTH_H_
#define TESSERA_SERVER_REPLICA_AUTH_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/ps.pb.h"

namespace tessera {

// Binary metadata carrying a Replicate call's credential (gRPC wants "-bin" for bytes).
inline constexpr char kReplicaCredentialHeader[] = "tessera-replica-credential-bin";
// Sizes of an X25519 public key and of a credential (a 12-byte nonce, then a 16-byte tag).
inline constexpr size_t kReplicationKeyBytes = 32;
inline constexpr size_t kReplicaCredentialBytes = 28;

// A server's replication key pair. Immutable after Generate but for a cache of the keys it shares with peers;
// thread-safe.
class ReplicaKey {
 public:
  // A fresh key pair. INTERNAL when OpenSSL cannot make one.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ReplicaKey>> Generate();
  ~ReplicaKey();
  ReplicaKey(const ReplicaKey&) = delete;
  ReplicaKey& operator=(const ReplicaKey&) = delete;

  // The public key (kReplicationKeyBytes), for the registration.
  const std::string& public_key() const { return public_key_; }

  // As the primary: the credential of a call holding `batch` (whose units name this server as their primary) for
  // backup `backup_id` (incarnation `backup_incarnation`, public key `backup_public_key`). A fresh nonce every
  // call. Empty when the backup's key is not a usable X25519 key or OpenSSL fails (the backup refuses the call).
  std::string Credential(absl::string_view backup_public_key, int backup_id, uint64_t backup_incarnation,
                         const tessera::v1::ReplicateBatch& batch) const;
  std::string Credential(absl::string_view backup_public_key, int backup_id, uint64_t backup_incarnation,
                         const tessera::v1::ReplicateRequest& request) const;
  // As the backup (`own_id`, `own_incarnation`): whether `credential` is the tag of `batch` under the key this
  // server shares with its primary (the units' server_id, whose public key is `primary_public_key`).
  bool Verify(absl::string_view primary_public_key, int own_id, uint64_t own_incarnation,
              const tessera::v1::ReplicateBatch& batch, absl::string_view credential) const;

 private:
  struct Key;
  using PairKey = std::array<unsigned char, 32>;
  ReplicaKey(std::unique_ptr<Key> key, std::string public_key);
  // The key for hand-overs from `primary_id` (public key `primary_public`) to `backup_id` (`backup_public`,
  // `backup_incarnation`), one of them this server; the other's public key is `peer_public`. False when the peer's
  // key is unusable.
  bool Pair(absl::string_view peer_public, absl::string_view primary_public, absl::string_view backup_public,
            int primary_id, int backup_id, uint64_t backup_incarnation, PairKey& out) const;

  const std::unique_ptr<Key> key_;
  const std::string public_key_;
  // One counter for every pair: a nonce is never used twice under any key this server holds.
  mutable std::atomic<uint64_t> next_nonce_{1};
  mutable absl::Mutex pairs_mu_;
  mutable std::map<std::tuple<std::string, int, int, uint64_t>, PairKey> pairs_ ABSL_GUARDED_BY(pairs_mu_);
};

// Every number of a Replicate call within common/model/wire_limits.h, checked before anything is taken from it: the
// epoch (kMaxEpoch), the primary's id (within `num_servers`), the state's version, update and assignment counts
// (0 .. kMaxUpdateCount, the counts not above the version), its clocks (0 .. kMaxClock, one per worker at most),
// its sequence table (workers within `num_workers`, numbers 1 .. kMaxUpdateCount), and the updates (versions
// consecutive and ending at the state's, clocks within 0 .. kMaxClock, finite scales). INVALID_ARGUMENT naming
// the field otherwise.
[[nodiscard]] absl::Status CheckReplicateRequest(const tessera::v1::ReplicateRequest& request, int num_servers,
                                                 int num_workers);

}  // namespace tessera

#endif  // TESSERA_SERVER_REPLICA_AUTH_H_
