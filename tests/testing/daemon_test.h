// What tests of the real binaries share: a scratch directory per test, the binaries' folder, and ways to find
// the daemons a test started.
#ifndef TESSERA_TESTS_TESTING_DAEMON_TEST_H_
#define TESSERA_TESTS_TESTING_DAEMON_TEST_H_

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/job_spec.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "worker/param_file.h"

namespace tessera::testing {

inline const std::string kBin = TESSERA_BIN_DIR;

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("tessera-", name, "-", getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  // Trains `job_text` alone in one CPU worker process (the baseline) and writes its final parameters to `dump`.
  void RunLocal(const std::string& job_text, const std::string& dump) {
    Subprocess local({kBin + "/tessera-worker", "--local", "--device=cpu", "--job=" + Write("local.pbtxt", job_text),
                      "--dump_params=" + dump});
    ASSERT_TRUE(local.ReadUntilExit(absl::Seconds(300))) << local.output();
    ASSERT_EQ(local.exit_code(), 0) << local.output();
  }

  static bool HaveFashionMnist() {
    return std::filesystem::exists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz");
  }

  std::filesystem::path dir_;
};

// The tensors of the parameter files `a` and `b` are equal in every bit.
inline void ExpectIdenticalParameters(const std::string& a, const std::string& b) {
  absl::StatusOr<NamedTensors> first = ReadParamFile(a);
  absl::StatusOr<NamedTensors> second = ReadParamFile(b);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(first->size(), second->size());
  for (const auto& [name, values] : *first) {
    auto other = second->find(name);
    ASSERT_NE(other, second->end()) << name;
    ASSERT_EQ(values.size(), other->second.size()) << name;
    EXPECT_EQ(std::memcmp(values.data(), other->second.data(), values.size() * sizeof(float)), 0)
        << name << " differs";
  }
}

// Runs the job file `job` to its end with tessera-launch, nothing disturbed (records in "full" beside `dump`);
// its final parameters go to `dump`.
inline void RunLaunched(const std::string& job, const std::string& dump) {
  const std::filesystem::path run = std::filesystem::path(dump).parent_path() / "full";
  Subprocess full({kBin + "/tessera-launch", "--linger_s=0", "--job=" + job, "--run_dir=" + run.string(),
                   "--device=cpu", "--dump_params=" + dump});
  ASSERT_TRUE(full.ReadUntilExit(absl::Seconds(180))) << full.output();
  ASSERT_EQ(full.exit_code(), 0) << full.output();
}

// The parameter files `a` and `b` hold the same tensors, to a relative error under `tolerance`.
inline void ExpectSameParameters(const std::string& a, const std::string& b, double tolerance) {
  absl::StatusOr<NamedTensors> first = ReadParamFile(a);
  absl::StatusOr<NamedTensors> second = ReadParamFile(b);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<double> error = RelativeError(*first, *second);
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_LT(*error, tolerance);
}

// Process ids whose command line mentions `text` (other than this test process).
inline std::vector<int> ProcessesMentioning(const std::string& text) {
  std::vector<int> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), {});
    if (std::stoi(name) != getpid() && cmdline.find(text) != std::string::npos) found.push_back(std::stoi(name));
  }
  return found;
}

// A JSON file (a summary); discarded (is_discarded()) when missing or unparsable.
inline nlohmann::json ReadJson(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

// The number after the first `marker` in a daemon's output (a port: "serving at 127.0.0.1:"); -1 without one.
inline int PortAfter(const std::string& output, const std::string& marker) {
  const size_t at = output.find(marker);
  return at == std::string::npos ? -1 : std::atoi(output.c_str() + at + marker.size());
}

// The newest step of the scheduler's progress lines ("step    300 | ..."); 0 before the first.
inline int64_t LastStep(const std::string& output) {
  const size_t at = output.rfind("step ");
  return at == std::string::npos ? 0 : std::atoll(output.c_str() + at + 5);
}

inline std::string SchedulerAddress(const std::string& output) {
  const std::string marker = "scheduler listening on ";
  const size_t at = output.find(marker);
  if (at == std::string::npos) return "";
  return output.substr(at + marker.size(), output.find('\n', at) - at - marker.size());
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_DAEMON_TEST_H_
