#include "server/replica_auth.h"

#include <openssl/evp.h>
#include <openssl/sha.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_limits.h"

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace tessera {

struct ReplicaSigner::Key {
  EVP_PKEY* pkey = nullptr;
  ~Key() { EVP_PKEY_free(pkey); }
};

ReplicaSigner::ReplicaSigner(std::unique_ptr<Key> key, std::string public_key)
    : key_(std::move(key)), public_key_(std::move(public_key)) {}

ReplicaSigner::~ReplicaSigner() = default;

absl::StatusOr<std::unique_ptr<ReplicaSigner>> ReplicaSigner::Generate() {
  auto key = std::make_unique<Key>();
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr);
  const bool made = ctx != nullptr && EVP_PKEY_keygen_init(ctx) == 1 && EVP_PKEY_keygen(ctx, &key->pkey) == 1;
  EVP_PKEY_CTX_free(ctx);
  std::string public_key(kReplicationKeyBytes, '\0');
  size_t length = public_key.size();
  if (!made || EVP_PKEY_get_raw_public_key(key->pkey, reinterpret_cast<unsigned char*>(public_key.data()),
                                           &length) != 1 ||
      length != kReplicationKeyBytes) {
    return absl::InternalError("cannot make an Ed25519 key pair (OpenSSL)");
  }
  return std::unique_ptr<ReplicaSigner>(new ReplicaSigner(std::move(key), std::move(public_key)));
}

std::string ReplicaSigner::Sign(absl::string_view message) const {
  std::string signature(kReplicaSignatureBytes, '\0');
  size_t length = signature.size();
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool signed_ok =
      ctx != nullptr && EVP_DigestSignInit(ctx, nullptr, nullptr, nullptr, key_->pkey) == 1 &&
      EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(signature.data()), &length,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  EVP_MD_CTX_free(ctx);
  if (!signed_ok || length != kReplicaSignatureBytes) return "";
  return signature;
}

namespace {
// Adds `request`'s deterministic serialization (the map of sequence numbers in key order, so the backup's
// serialization of what it parsed is the primary's), after its length, to `sha`.
void HashUnit(const tessera::v1::ReplicateRequest& request, std::string& scratch, EVP_MD_CTX* sha) {
  scratch.clear();
  {
    google::protobuf::io::StringOutputStream stream(&scratch);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    request.SerializeToCodedStream(&coded);
  }
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>((uint64_t{scratch.size()} >> (8 * i)) & 0xff);
  EVP_DigestUpdate(sha, length, sizeof(length));
  EVP_DigestUpdate(sha, scratch.data(), scratch.size());
}

// SHA-256 over what `add` hashes.
template <typename Add>
std::string Sha256(Add add) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  unsigned int length = 0;
  EVP_MD_CTX* sha = EVP_MD_CTX_new();
  const bool ok = sha != nullptr && EVP_DigestInit_ex(sha, EVP_sha256(), nullptr) == 1;
  if (ok) add(sha);
  const bool done = ok && EVP_DigestFinal_ex(sha, digest, &length) == 1 && length == sizeof(digest);
  EVP_MD_CTX_free(sha);
  // An empty digest matches no signature: the backup refuses the call.
  return done ? std::string(reinterpret_cast<const char*>(digest), sizeof(digest)) : std::string();
}
}  // namespace

std::string ReplicateDigest(const tessera::v1::ReplicateBatch& batch) {
  return Sha256([&batch](EVP_MD_CTX* sha) {
    std::string scratch;
    for (const tessera::v1::ReplicateRequest& unit : batch.units()) HashUnit(unit, scratch, sha);
  });
}

std::string ReplicateDigest(const tessera::v1::ReplicateRequest& request) {
  return Sha256([&request](EVP_MD_CTX* sha) {
    std::string scratch;
    HashUnit(request, scratch, sha);
  });
}

std::string ReplicateProof(absl::string_view digest, int backup_id, uint64_t backup_incarnation) {
  std::string proof("tessera.v1.Replicate\n");
  proof.append(digest.data(), digest.size());
  // Little-endian: the backup's id (32 bits), then its incarnation (64 bits).
  const uint32_t id = static_cast<uint32_t>(backup_id);
  for (int i = 0; i < 4; ++i) proof.push_back(static_cast<char>((id >> (8 * i)) & 0xff));
  for (int i = 0; i < 8; ++i) proof.push_back(static_cast<char>((backup_incarnation >> (8 * i)) & 0xff));
  return proof;
}

bool VerifyReplicaSignature(absl::string_view public_key, absl::string_view message, absl::string_view signature) {
  if (public_key.size() != kReplicationKeyBytes || signature.size() != kReplicaSignatureBytes) return false;
  EVP_PKEY* pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr,
                                               reinterpret_cast<const unsigned char*>(public_key.data()),
                                               public_key.size());
  if (pkey == nullptr) return false;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool valid = ctx != nullptr && EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, pkey) == 1 &&
                     EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                                      reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(pkey);
  return valid;
}

absl::Status CheckReplicateRequest(const tessera::v1::ReplicateRequest& request, int num_servers, int num_workers) {
  const tessera::v1::ChunkState& state = request.state();
  const std::string what = absl::StrCat("Replicate of chunk ", state.param().substr(0, kMaxNameBytes), "/",
                                        state.index(), " from server ", request.server_id());
  auto bad = [&what](auto&&... why) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", why...));
  };
  if (request.epoch() > kMaxEpoch) return bad("epoch ", request.epoch(), " is beyond ", kMaxEpoch);
  if (request.server_id() < 0 || request.server_id() >= num_servers) {
    return bad("the job has ", num_servers, " servers");
  }
  TESSERA_RETURN_IF_ERROR(CheckLength("parameter name", state.param(), kMaxNameBytes));
  if (state.version() < 0 || state.version() > kMaxUpdateCount || state.gradient_updates() < 0 ||
      state.gradient_updates() > state.version() || state.assignments() < 0 ||
      state.assignments() > state.version()) {
    return bad("version ", state.version(), " with ", state.gradient_updates(), " updates and ",
               state.assignments(), " assignments; a version is within 0 .. ", kMaxUpdateCount,
               " and counts no more than it");
  }
  if (state.applied_clocks_size() > num_workers) {
    return bad(state.applied_clocks_size(), " clocks for a job of ", num_workers, " workers");
  }
  for (int64_t clock : state.applied_clocks()) {
    if (clock < 0 || clock > kMaxClock) return bad("clock ", clock, " is not within 0 .. ", kMaxClock);
  }
  for (const auto& [worker, seq] : state.last_seq()) {
    if (worker < 0 || worker >= num_workers || seq == 0 || seq > static_cast<uint64_t>(kMaxUpdateCount)) {
      return bad("sequence number ", seq, " of worker ", worker, ": workers 0 .. ", num_workers - 1,
                 ", numbers 1 .. ", kMaxUpdateCount);
    }
  }
  const int updates = request.updates_size();
  for (int i = 0; i < updates; ++i) {
    const tessera::v1::ChunkUpdate& u = request.updates(i);
    if (u.version() != state.version() - (updates - 1 - i)) {
      return bad("update ", i, " to version ", u.version(), ": updates are consecutive and end at the state's ",
                 state.version());
    }
    if (u.clock() < 0 || u.clock() > kMaxClock || !std::isfinite(u.lr_scale()) || !std::isfinite(u.grad_scale())) {
      return bad("update to version ", u.version(), " at clock ", u.clock(), " with scales ", u.lr_scale(), " and ",
                 u.grad_scale(), ": a clock within 0 .. ", kMaxClock, ", finite scales");
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
