#include "common/daemon/command_line.h"

#include "gflags/gflags.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

// The flags of this "program" are the ones defined in this file.
DEFINE_int32(port, 0, "a port");
DEFINE_int32(http_port, 0, "another port");
DEFINE_int32(interval_ms, 500, "an interval");
DEFINE_string(scheduler, "", "an address");
DEFINE_bool(insecure, false, "a switch");

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kOwnFlags[] = "command_line_test.cc";

class CommandLineTest : public ::testing::Test {
 protected:
  void SetUp() override { saver_ = std::make_unique<gflags::FlagSaver>(); }
  void TearDown() override { saver_.reset(); }

  absl::Status Parse(std::vector<std::string> args, std::vector<std::string> environment = {}) {
    warnings_.clear();
    return ParseProgramFlagsFrom(kOwnFlags, std::move(args), environment, &warnings_);
  }

  std::vector<std::string> warnings_;
  std::unique_ptr<gflags::FlagSaver> saver_;
};

TEST_F(CommandLineTest, EveryOwnFlagCanComeFromItsVariableAndTheCommandLineWins) {
  ASSERT_THAT(Parse({"--port=7001"}, {"TESSERA_PORT=7000", "TESSERA_SCHEDULER=host:1", "TESSERA_INSECURE=true",
                                      "TESSERA_HTTP_PORT=8080"}),
              IsOk());
  EXPECT_EQ(FLAGS_port, 7001);
  EXPECT_EQ(FLAGS_http_port, 8080);
  EXPECT_EQ(FLAGS_scheduler, "host:1");
  EXPECT_TRUE(FLAGS_insecure);
  EXPECT_TRUE(warnings_.empty());
  EXPECT_EQ(FlagEnvironmentVariable("http_port"), "TESSERA_HTTP_PORT");
}

TEST_F(CommandLineTest, CommandLineFormsOfGflagsAreUnderstood) {
  ASSERT_THAT(Parse({"-port", "9", "--scheduler", "a:1", "--insecure", "--nointerval_ms=3"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown flag --nointerval_ms"));
  ASSERT_THAT(Parse({"-port", "9", "--scheduler", "a:1", "--insecure"}), IsOk());
  EXPECT_EQ(FLAGS_port, 9);
  EXPECT_EQ(FLAGS_scheduler, "a:1");
  EXPECT_TRUE(FLAGS_insecure);
  ASSERT_THAT(Parse({"--noinsecure"}), IsOk());
  EXPECT_FALSE(FLAGS_insecure);
}

TEST_F(CommandLineTest, PositionalArgumentsUnknownFlagsAndBadValuesAreRefusedNamingThem) {
  EXPECT_THAT(Parse({"--port=1", "stray"}), StatusIs(absl::StatusCode::kInvalidArgument, "'stray'"));
  EXPECT_THAT(Parse({"--", "after"}), StatusIs(absl::StatusCode::kInvalidArgument, "'after'"));
  EXPECT_THAT(Parse({"--prot=1"}), StatusIs(absl::StatusCode::kInvalidArgument, "--prot"));
  EXPECT_THAT(Parse({"--port=abc"}), StatusIs(absl::StatusCode::kInvalidArgument, "--port=abc (command line)"));
  EXPECT_THAT(Parse({}, {"TESSERA_PORT=abc"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "--port=abc (TESSERA_PORT)"));
  EXPECT_THAT(Parse({"--scheduler"}), StatusIs(absl::StatusCode::kInvalidArgument, "needs a value"));
}

TEST_F(CommandLineTest, OtherTesseraVariablesAreReportedAndKubernetesServiceLinksIgnored) {
  ASSERT_THAT(Parse({}, {"TESSERA_PROT=1", "TESSERA_SCHEDULER_SERVICE_HOST=10.0.0.7",
                         "TESSERA_SCHEDULER_PORT=tcp://10.0.0.7:7070", "TESSERA_SCHEDULER_PORT_7070_TCP_PORT=7070",
                         "TESSERA_BUILD_DIR=build", "TESSERA_CMAKE_ARGS=-DX=1", "PATH=/bin"}),
              IsOk());
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_THAT(warnings_[0], HasSubstr("TESSERA_PROT"));
  EXPECT_THAT(warnings_[0], ::testing::Not(HasSubstr("SERVICE")));
  // The project's own build and deploy scripts' variables are not a user's typo.
  EXPECT_THAT(warnings_[0], ::testing::Not(HasSubstr("TESSERA_BUILD_DIR")));
  EXPECT_THAT(warnings_[0], ::testing::Not(HasSubstr("TESSERA_CMAKE_ARGS")));
}

TEST_F(CommandLineTest, RulesNameTheFlagItsValueAndWhereItCameFrom) {
  ASSERT_THAT(Parse({"--port=99999"}, {"TESSERA_INTERVAL_MS=0"}), IsOk());
  EXPECT_THAT(CheckFlagRules({PortFlag("port")}),
              StatusIs(absl::StatusCode::kInvalidArgument, "--port=99999 (command line): must be a port"));
  EXPECT_THAT(CheckFlagRules({PositiveFlag("interval_ms")}),
              StatusIs(absl::StatusCode::kInvalidArgument, "--interval_ms=0 (TESSERA_INTERVAL_MS): must be > 0"));
  ASSERT_THAT(Parse({"--port=0", "--http_port=-1", "--interval_ms=1"}), IsOk());
  EXPECT_THAT(CheckFlagRules({PortFlag("port"), PortFlag("http_port", /*off_allowed=*/true), PositiveFlag("interval_ms")}),
              IsOk());
  EXPECT_THAT(CheckFlagRules({PortFlag("http_port")}), StatusIs(absl::StatusCode::kInvalidArgument, ""));
}

TEST(PortOptionTest, TheSameRuleForAnOptionAlreadyRead) {
  EXPECT_THAT(CheckPortOption("--http_port", -2, /*off_allowed=*/true),
              StatusIs(absl::StatusCode::kInvalidArgument, "--http_port=-2: must be a port"));
  EXPECT_THAT(CheckPortOption("--port", 65536, /*off_allowed=*/false), StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(CheckPortOption("--port", -1, /*off_allowed=*/false), StatusIs(absl::StatusCode::kInvalidArgument, ""));
  EXPECT_THAT(CheckPortOption("--http_port", -1, /*off_allowed=*/true), IsOk());
  EXPECT_THAT(CheckPortOption("--port", 0, /*off_allowed=*/false), IsOk());
  EXPECT_THAT(CheckPortOption("--port", 65535, /*off_allowed=*/false), IsOk());
}

TEST(VersionTest, NamesTheVersionAndTheCommit) {
  EXPECT_THAT(VersionString(), ::testing::MatchesRegex("[0-9]+\\.[0-9]+\\.[0-9]+ \\(commit [0-9a-z-]+\\)"));
}

}  // namespace
}  // namespace tessera
