// The input of Tessera's request fuzzers: a sequence of requests, each
//   [operation: 1 byte] [length: 2 bytes, little-endian] [length bytes: a serialised request message]
// so that a seed made of valid messages (tests/fuzz/corpus/) is one the fuzzer can mutate message by message.
#ifndef TESSERA_TESTS_FUZZ_FUZZ_INPUT_H_
#define TESSERA_TESTS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::fuzz {

class RequestReader {
 public:
  RequestReader(const uint8_t* data, size_t size) : data_(reinterpret_cast<const char*>(data)), size_(size) {}

  // The next request; false at the end (a truncated last request is cut short, not dropped).
  bool Next(uint8_t* operation, std::string_view* message) {
    if (at_ >= size_) return false;
    *operation = static_cast<uint8_t>(data_[at_++]);
    size_t length = 0;
    for (int i = 0; i < 2 && at_ < size_; ++i) length |= static_cast<size_t>(static_cast<uint8_t>(data_[at_++])) << (8 * i);
    length = std::min(length, size_ - at_);
    *message = std::string_view(data_ + at_, length);
    at_ += length;
    return true;
  }

 private:
  const char* data_;
  size_t size_;
  size_t at_ = 0;
};

// Appends one request in the format above (seeds).
inline void AppendRequest(uint8_t operation, const std::string& message, std::string* out) {
  out->push_back(static_cast<char>(operation));
  out->push_back(static_cast<char>(message.size() & 0xff));
  out->push_back(static_cast<char>((message.size() >> 8) & 0xff));
  out->append(message);
}

}  // namespace tessera::fuzz

#endif  // TESSERA_TESTS_FUZZ_FUZZ_INPUT_H_
