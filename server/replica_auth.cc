#include "server/replica_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/wire_limits.h"

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"

namespace tessera {

struct ReplicaKey::Key {
  EVP_PKEY* pkey = nullptr;
  ~Key() { EVP_PKEY_free(pkey); }
};

ReplicaKey::ReplicaKey(std::unique_ptr<Key> key, std::string public_key)
    : key_(std::move(key)), public_key_(std::move(public_key)) {}

ReplicaKey::~ReplicaKey() = default;

absl::StatusOr<std::unique_ptr<ReplicaKey>> ReplicaKey::Generate() {
  auto key = std::make_unique<Key>();
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr);
  const bool made = ctx != nullptr && EVP_PKEY_keygen_init(ctx) == 1 && EVP_PKEY_keygen(ctx, &key->pkey) == 1;
  EVP_PKEY_CTX_free(ctx);
  std::string public_key(kReplicationKeyBytes, '\0');
  size_t length = public_key.size();
  if (!made || EVP_PKEY_get_raw_public_key(key->pkey, reinterpret_cast<unsigned char*>(public_key.data()),
                                           &length) != 1 ||
      length != kReplicationKeyBytes) {
    return absl::InternalError("cannot make an X25519 key pair (OpenSSL)");
  }
  return std::unique_ptr<ReplicaKey>(new ReplicaKey(std::move(key), std::move(public_key)));
}

namespace {
const unsigned char* Bytes(absl::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); }

void AppendLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// The X25519 shared secret of `own` and `peer_public`; false for a key of another size, a low-order point (OpenSSL
// refuses an all-zero secret) or any other failure.
bool SharedSecret(EVP_PKEY* own, absl::string_view peer_public, unsigned char (&secret)[32]) {
  if (peer_public.size() != kReplicationKeyBytes) return false;
  EVP_PKEY* peer = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, Bytes(peer_public), peer_public.size());
  if (peer == nullptr) return false;
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new(own, nullptr);
  size_t length = sizeof(secret);
  const bool ok = ctx != nullptr && EVP_PKEY_derive_init(ctx) == 1 && EVP_PKEY_derive_set_peer(ctx, peer) == 1 &&
                  EVP_PKEY_derive(ctx, secret, &length) == 1 && length == sizeof(secret);
  EVP_PKEY_CTX_free(ctx);
  EVP_PKEY_free(peer);
  return ok;
}

// HKDF-SHA256 of `secret` with `info`, 32 bytes.
bool Hkdf(const unsigned char (&secret)[32], const std::string& info, std::array<unsigned char, 32>& out) {
  static constexpr char kSalt[] = "tessera.v1.Replicate";
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  size_t length = out.size();
  const bool ok = ctx != nullptr && EVP_PKEY_derive_init(ctx) == 1 &&
                  EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) == 1 &&
                  EVP_PKEY_CTX_set1_hkdf_salt(ctx, reinterpret_cast<const unsigned char*>(kSalt),
                                              sizeof(kSalt) - 1) == 1 &&
                  EVP_PKEY_CTX_set1_hkdf_key(ctx, secret, sizeof(secret)) == 1 &&
                  EVP_PKEY_CTX_add1_hkdf_info(ctx, Bytes(info), static_cast<int>(info.size())) == 1 &&
                  EVP_PKEY_derive(ctx, out.data(), &length) == 1 && length == out.size();
  EVP_PKEY_CTX_free(ctx);
  return ok;
}

// Feeds what a CodedOutputStream writes to `add` through one small buffer, so that a unit's serialization is
// authenticated while it is made, from cache, without a copy of the whole unit.
class StreamingSink final : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  explicit StreamingSink(std::function<void(const char*, size_t)> add) : add_(std::move(add)) {}
  ~StreamingSink() override { Flush(); }
  bool Next(void** data, int* size) override {
    Flush();
    given_ = sizeof(buffer_);
    *data = buffer_;
    *size = static_cast<int>(given_);
    return true;
  }
  void BackUp(int count) override { given_ -= static_cast<size_t>(count); }
  int64_t ByteCount() const override { return static_cast<int64_t>(total_ + given_); }
  void Flush() {
    if (given_ > 0) add_(buffer_, given_);
    total_ += given_;
    given_ = 0;
  }

 private:
  std::function<void(const char*, size_t)> add_;
  char buffer_[64 << 10];
  size_t given_ = 0;   // bytes of buffer_ handed out and not backed up
  size_t total_ = 0;   // bytes flushed
};

// AES-256-GMAC of the batch's units (each as its length, 64 bits little-endian, and its deterministic
// serialization: the map of sequence numbers in key order, so the backup's serialization of what it parsed is the
// primary's) under `key` with the 12-byte `nonce`. Empty when OpenSSL fails.
std::string Gmac(const std::array<unsigned char, 32>& key, const unsigned char* nonce,
                 const tessera::v1::ReplicateBatch& batch) {
  // Fetched once: an implicit fetch on every call costs more than authenticating a small hand-over.
  static EVP_CIPHER* const gcm = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  bool ok = gcm != nullptr && ctx != nullptr && EVP_EncryptInit_ex(ctx, gcm, nullptr, nullptr, nullptr) == 1 &&
            EVP_EncryptInit_ex(ctx, nullptr, nullptr, key.data(), nonce) == 1;
  auto add = [&ok, ctx](const char* data, size_t size) {
    while (ok && size > 0) {
      const int piece = static_cast<int>(std::min<size_t>(size, size_t{1} << 30));
      int written = 0;
      ok = EVP_EncryptUpdate(ctx, nullptr, &written, reinterpret_cast<const unsigned char*>(data), piece) == 1;
      data += piece;
      size -= static_cast<size_t>(piece);
    }
  };
  {
    auto sink = std::make_unique<StreamingSink>(add);
    for (const tessera::v1::ReplicateRequest& unit : batch.units()) {
      google::protobuf::io::CodedOutputStream coded(sink.get());
      coded.SetSerializationDeterministic(true);
      std::string length;
      AppendLittleEndian(length, unit.ByteSizeLong(), 8);
      coded.WriteRaw(length.data(), static_cast<int>(length.size()));
      unit.SerializeWithCachedSizes(&coded);
    }
  }
  unsigned char tag[16];
  int written = 0;
  ok = ok && EVP_EncryptFinal_ex(ctx, tag, &written) == 1 &&
       EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, sizeof(tag), tag) == 1;
  EVP_CIPHER_CTX_free(ctx);
  return ok ? std::string(reinterpret_cast<const char*>(tag), sizeof(tag)) : std::string();
}

int PrimaryOf(const tessera::v1::ReplicateBatch& batch) {
  return batch.units_size() == 0 ? -1 : batch.units(0).server_id();
}
}  // namespace

bool ReplicaKey::Pair(absl::string_view peer_public, absl::string_view primary_public,
                      absl::string_view backup_public, int primary_id, int backup_id, uint64_t backup_incarnation,
                      PairKey& out) const {
  const auto cache_key = std::make_tuple(std::string(peer_public), primary_id, backup_id, backup_incarnation);
  {
    absl::MutexLock lock(&pairs_mu_);
    if (auto it = pairs_.find(cache_key); it != pairs_.end()) {
      out = it->second;
      return true;
    }
  }
  unsigned char secret[32];
  if (!SharedSecret(key_->pkey, peer_public, secret)) return false;
  // The direction and both ends: a key for hand-overs from A to B is not the key from B to A, nor one for
  // another incarnation of B.
  std::string info("tessera.v1.Replicate primary ");
  info.append(primary_public.data(), primary_public.size());
  AppendLittleEndian(info, static_cast<uint32_t>(primary_id), 4);
  info.append(" backup ");
  info.append(backup_public.data(), backup_public.size());
  AppendLittleEndian(info, static_cast<uint32_t>(backup_id), 4);
  AppendLittleEndian(info, backup_incarnation, 8);
  const bool ok = Hkdf(secret, info, out);
  OPENSSL_cleanse(secret, sizeof(secret));
  if (!ok) return false;
  absl::MutexLock lock(&pairs_mu_);
  if (pairs_.size() >= 4096) pairs_.clear();  // peers of long-gone views; the nonce counter is not per pair
  pairs_[cache_key] = out;
  return true;
}

std::string ReplicaKey::Credential(absl::string_view backup_public_key, int backup_id, uint64_t backup_incarnation,
                                   const tessera::v1::ReplicateBatch& batch) const {
  PairKey pair;
  if (!Pair(backup_public_key, public_key_, backup_public_key, PrimaryOf(batch), backup_id, backup_incarnation,
            pair)) {
    return "";
  }
  std::string credential;
  AppendLittleEndian(credential, 0, 4);
  AppendLittleEndian(credential, next_nonce_.fetch_add(1), 8);
  const std::string tag = Gmac(pair, Bytes(credential), batch);
  OPENSSL_cleanse(pair.data(), pair.size());
  if (tag.empty()) return "";
  return credential + tag;
}

std::string ReplicaKey::Credential(absl::string_view backup_public_key, int backup_id, uint64_t backup_incarnation,
                                   const tessera::v1::ReplicateRequest& request) const {
  tessera::v1::ReplicateBatch batch;
  *batch.add_units() = request;
  return Credential(backup_public_key, backup_id, backup_incarnation, batch);
}

bool ReplicaKey::Verify(absl::string_view primary_public_key, int own_id, uint64_t own_incarnation,
                        const tessera::v1::ReplicateBatch& batch, absl::string_view credential) const {
  if (credential.size() != kReplicaCredentialBytes) return false;
  PairKey pair;
  if (!Pair(primary_public_key, primary_public_key, public_key_, PrimaryOf(batch), own_id, own_incarnation, pair)) {
    return false;
  }
  const std::string tag = Gmac(pair, Bytes(credential), batch);
  OPENSSL_cleanse(pair.data(), pair.size());
  return tag.size() == 16 && CRYPTO_memcmp(tag.data(), credential.data() + 12, 16) == 0;
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
