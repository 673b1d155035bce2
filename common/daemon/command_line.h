// Command-line handling shared by every Tessera program: its own flags from the command line or from TESSERA_*
// environment variables, --help, --version, and checks of flag values with messages that name the flag.
//
//   int main(int argc, char** argv) {
//     tessera::ParseProgramFlags("tessera-server --scheduler=HOST:PORT", "_main.cc", &argc, &argv);
//     tessera::CheckFlags({tessera::PortFlag("port"), tessera::PositiveFlag("heartbeat_timeout_ms")});
#ifndef TESSERA_COMMON_DAEMON_COMMAND_LINE_H_
#define TESSERA_COMMON_DAEMON_COMMAND_LINE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace tessera {

// "0.10.0 (commit 1a2b3c4d5e6f)": what --version prints after the program's name.
std::string VersionString();

// The environment variable that may set flag `name`: TESSERA_ and the name in upper case (port -> TESSERA_PORT).
std::string FlagEnvironmentVariable(const std::string& name);

// The program's own flags are those defined in a source file whose path contains `own_flags_file` (for the
// daemons "_main.cc"; library flags such as glog's are not the program's).
//
// In order: --help or -h prints the usage message and the program's own flags and exits 0; --version prints the
// version and commit and exits 0; every own flag named by a TESSERA_* variable takes its value; the command line
// is parsed (a flag given there wins over the environment); a TESSERA_* variable that names no own flag is
// reported as a warning (it may be meant for another Tessera program sharing the environment). A bad value in a
// variable, an unknown flag, or a positional argument prints one line naming it and exits 2.
void ParseProgramFlags(const char* usage, const char* own_flags_file, int* argc, char*** argv);

// As ParseProgramFlags, but returns the problem instead of exiting (tests); `environment` replaces the process's.
absl::Status ParseProgramFlagsFrom(const char* own_flags_file, std::vector<std::string> args,
                                   const std::vector<std::string>& environment,
                                   std::vector<std::string>* warnings);

// A rule for one flag's value, checked after parsing. `check` returns an empty string when the value is allowed,
// otherwise what is allowed ("a port: 0..65535, 0 picks a free one").
struct FlagRule {
  std::string name;
  std::function<std::string(int64_t value)> check;
};

FlagRule PortFlag(const std::string& name, bool off_allowed = false);  // 0..65535 (0: any free); -1 if off_allowed
FlagRule PositiveFlag(const std::string& name);                        // > 0 (intervals, timeouts, sizes)
FlagRule NonNegativeFlag(const std::string& name);                     // >= 0 (counts; 0: none or the default)
FlagRule AtLeastFlag(const std::string& name, int64_t minimum, const std::string& meaning);

// The port rule for an option already read (e.g. a daemon's options struct): INVALID_ARGUMENT
// "<flag>=<port>: must be a port, ..." unless 0 <= port <= 65535 (or -1 when `off_allowed`).
[[nodiscard]] absl::Status CheckPortOption(std::string_view flag, int64_t port, bool off_allowed);

// Checks every rule against the parsed flags: OK, or INVALID_ARGUMENT "--port=99999 (from TESSERA_PORT): must be
// a port: ..." for the first flag that breaks its rule.
absl::Status CheckFlagRules(const std::vector<FlagRule>& rules);

// CheckFlagRules, printing the problem as "<program>: ..." and exiting 2 when there is one.
void CheckFlags(const std::vector<FlagRule>& rules);

}  // namespace tessera

#endif  // TESSERA_COMMON_DAEMON_COMMAND_LINE_H_
