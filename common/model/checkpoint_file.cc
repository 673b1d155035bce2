#include "common/model/checkpoint_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/crc32c.h"

namespace tessera {
namespace {

constexpr char kMagic[8] = {'T', 'S', 'R', 'A', 'C', 'K', 'P', 'T'};

template <typename T>
void Put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

// Reads fixed-size fields from a byte string, remembering whether it ran short.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  bool Get(T& value) {
    if (bytes_.size() - at_ < sizeof(T) || at_ > bytes_.size()) return false;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool GetBytes(size_t n, std::string& out) {
    if (bytes_.size() - at_ < n) return false;
    out.assign(bytes_.data() + at_, n);
    at_ += n;
    return true;
  }
  size_t at() const { return at_; }

 private:
  std::string_view bytes_;
  size_t at_ = 0;
};

// The code follows errno (a full disk is RESOURCE_EXHAUSTED, a folder that cannot be written PERMISSION_DENIED).
absl::Status Errno(const std::string& what, const std::string& path, int error = errno) {
  return absl::Status(absl::ErrnoToStatusCode(error),
                      absl::StrCat("cannot ", what, " checkpoint file ", path, ": ", strerror(error)));
}

}  // namespace

std::string EncodeCheckpoint(const CheckpointHeader& header, std::string_view payload) {
  std::string bytes(kMagic, sizeof(kMagic));
  Put<uint32_t>(bytes, kCheckpointFormatVersion);
  Put<uint64_t>(bytes, header.epoch);
  Put<int64_t>(bytes, header.clock);
  Put<uint64_t>(bytes, payload.size());
  Put<uint32_t>(bytes, Crc32c(payload));
  Put<uint32_t>(bytes, static_cast<uint32_t>(header.job.size()));
  bytes += header.job;
  Put<uint32_t>(bytes, Crc32c(bytes));
  bytes.append(payload.data(), payload.size());
  return bytes;
}

absl::Status WriteCheckpointFile(const std::string& path, const CheckpointHeader& header,
                                 const google::protobuf::Message& message) {
  std::string payload;
  if (!message.SerializeToString(&payload)) {
    return absl::InternalError(absl::StrCat("cannot serialise checkpoint ", path));
  }
  const std::string bytes = EncodeCheckpoint(header, payload);

  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", tmp);
  // Every failure from here on leaves nothing behind.
  auto failed = [&](const char* what, int error) {
    close(fd);
    unlink(tmp.c_str());
    return Errno(what, tmp, error);
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return failed("write", n == 0 ? EIO : errno);
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return failed("fsync", errno);
  if (close(fd) != 0) {  // a network file system or a quota may report a full disk only here
    const int error = errno;
    unlink(tmp.c_str());
    return Errno("close", tmp, error);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(tmp.c_str());
    return Errno("rename to", path, error);
  }
  // The rename is durable once the folder is.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dir_fd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointHeader> ReadCheckpointFile(const std::string& path, google::protobuf::Message* message) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("checkpoint file ", path, " does not exist"));
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  return DecodeCheckpoint(bytes, path, message);
}

absl::StatusOr<CheckpointHeader> DecodeCheckpoint(std::string_view bytes, const std::string& path,
                                                  google::protobuf::Message* message) {
  auto bad = [&](const std::string& check) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is refused: ", check));
  };
  Reader reader(bytes);
  std::string magic;
  if (!reader.GetBytes(sizeof(kMagic), magic) || magic != std::string(kMagic, sizeof(kMagic))) {
    return bad("it does not start with the checkpoint magic (not a Tessera checkpoint, or truncated)");
  }
  uint32_t version = 0, payload_crc = 0, job_size = 0, header_crc = 0;
  uint64_t payload_size = 0;
  CheckpointHeader header;
  if (!reader.Get(version)) return bad("the header is truncated");
  if (version != kCheckpointFormatVersion) {
    return bad(absl::StrCat("format version ", version, ", this build reads version ", kCheckpointFormatVersion));
  }
  if (!reader.Get(header.epoch) || !reader.Get(header.clock) || !reader.Get(payload_size) ||
      !reader.Get(payload_crc) || !reader.Get(job_size) || !reader.GetBytes(job_size, header.job)) {
    return bad("the header is truncated");
  }
  const size_t header_end = reader.at();
  if (!reader.Get(header_crc)) return bad("the header is truncated");
  if (Crc32c(std::string_view(bytes.data(), header_end)) != header_crc) return bad("header CRC-32C mismatch");
  const size_t payload_at = reader.at();
  if (bytes.size() - payload_at != payload_size) {
    return bad(absl::StrCat("the payload is ", bytes.size() - payload_at, " bytes, the header says ", payload_size,
                            " (truncated or appended to)"));
  }
  const std::string_view payload(bytes.data() + payload_at, payload_size);
  if (Crc32c(payload) != payload_crc) return bad("payload CRC-32C mismatch");
  if (!message->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return bad("the payload does not parse as a checkpoint message");
  }
  return header;
}

}  // namespace tessera
