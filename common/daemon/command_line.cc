#include "common/daemon/command_line.h"

#include <cstdlib>
#include <iostream>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/version_commit.h"
#include "gflags/gflags.h"

extern char** environ;

namespace tessera {
namespace {

constexpr char kEnvironmentPrefix[] = "TESSERA_";

// Where each flag set by ParseProgramFlags got its value, for messages about it.
std::map<std::string, std::string>& FlagOrigins() {
  static auto* origins = new std::map<std::string, std::string>();
  return *origins;
}

// Kubernetes gives every pod variables for each Service of its namespace (Service "tessera-scheduler":
// TESSERA_SCHEDULER_SERVICE_HOST, TESSERA_SCHEDULER_PORT=tcp://10.0.0.7:7070, ...). They are not settings.
bool IsServiceLink(const std::string& variable, const std::string& value) {
  return absl::StrContains(variable, "_SERVICE_HOST") || absl::StrContains(variable, "_SERVICE_PORT") ||
         absl::StartsWith(value, "tcp://") || absl::StartsWith(value, "udp://") || absl::StartsWith(value, "sctp://");
}

// Variables the project's own build and deploy scripts read (deploy/*.sh, the container build, the benchmark):
// they share the prefix with the flags' variables but are no flag's, and are not a user's typo.
bool IsProjectScriptVariable(const std::string& variable) {
  static const char* const kScriptVariables[] = {
      "TESSERA_BUILD_DIR",      "TESSERA_BUILD_JOBS",   "TESSERA_BUILD_PYTHON", "TESSERA_CMAKE_ARGS",
      "TESSERA_ENABLE_CUDA",    "TESSERA_FUZZ",         "TESSERA_BENCH_PYTORCH", "TESSERA_BENCH_TABLE",
      "TESSERA_BASE_IMAGE",     "TESSERA_CONTAINER_DIR", "TESSERA_IMAGE",       "TESSERA_STRIP",
      "TESSERA_DEBIAN_MIRROR",  "TESSERA_GPU_OUT"};
  for (const char* known : kScriptVariables) {
    if (variable == known) return true;
  }
  return false;
}

bool IsOwnFlag(const gflags::CommandLineFlagInfo& info, const char* own_flags_file) {
  return absl::StrContains(info.filename, own_flags_file);
}

absl::Status SetFlag(const std::string& name, const std::string& value, const std::string& origin) {
  gflags::CommandLineFlagInfo info;
  if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (", origin, "; --help lists the flags)"));
  }
  if (gflags::SetCommandLineOption(name.c_str(), value.c_str()).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, "=", value, " (", origin, "): not a valid ", info.type, " value"));
  }
  FlagOrigins()[name] = origin;
  return absl::OkStatus();
}

// Parses "--name=value", "--name value" (not for booleans), "--name" and "--noname" (booleans); "-name" alike.
absl::Status ParseArguments(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 2 || arg[0] != '-' || arg == "--") {
      const std::string positional = arg == "--" && i + 1 < args.size() ? args[i + 1] : arg;
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", positional, "': this program takes only --flags (see --help)"));
    }
    std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    std::string value;
    const size_t equals = body.find('=');
    const bool has_value = equals != std::string::npos;
    if (has_value) {
      value = body.substr(equals + 1);
      body.resize(equals);
    }
    gflags::CommandLineFlagInfo info;
    if (!has_value && !gflags::GetCommandLineFlagInfo(body.c_str(), &info) && absl::StartsWith(body, "no") &&
        gflags::GetCommandLineFlagInfo(body.substr(2).c_str(), &info) && info.type == "bool") {
      if (absl::Status s = SetFlag(body.substr(2), "false", "command line"); !s.ok()) return s;
      continue;
    }
    if (!gflags::GetCommandLineFlagInfo(body.c_str(), &info)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", body, " (--help lists the flags)"));
    }
    if (!has_value) {
      if (info.type == "bool") {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", body, " needs a value"));
      }
    }
    if (absl::Status s = SetFlag(body, value, "command line"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Empty when `port` is one; otherwise what it must be.
std::string PortProblem(int64_t port, bool off_allowed) {
  if ((port >= 0 && port <= 65535) || (off_allowed && port == -1)) return "";
  return off_allowed ? "must be a port, 0..65535 (0 picks a free one), or -1 (off)"
                     : "must be a port, 0..65535 (0 picks a free one)";
}

}  // namespace

std::string VersionString() { return absl::StrCat(TESSERA_VERSION, " (commit ", TESSERA_COMMIT, ")"); }

std::string FlagEnvironmentVariable(const std::string& name) {
  return absl::StrCat(kEnvironmentPrefix, absl::AsciiStrToUpper(name));
}

absl::Status ParseProgramFlagsFrom(const char* own_flags_file, std::vector<std::string> args,
                                   const std::vector<std::string>& environment,
                                   std::vector<std::string>* warnings) {
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  std::map<std::string, std::string> own;  // TESSERA_X -> x
  for (const gflags::CommandLineFlagInfo& info : flags) {
    if (IsOwnFlag(info, own_flags_file)) own[FlagEnvironmentVariable(info.name)] = info.name;
  }
  std::vector<std::string> unknown;
  for (const std::string& entry : environment) {
    if (!absl::StartsWith(entry, kEnvironmentPrefix)) continue;
    const size_t equals = entry.find('=');
    if (equals == std::string::npos) continue;
    const std::string variable = entry.substr(0, equals);
    if (IsServiceLink(variable, entry.substr(equals + 1))) continue;
    auto it = own.find(variable);
    if (it == own.end() && IsProjectScriptVariable(variable)) continue;
    if (it == own.end()) {
      unknown.push_back(variable);
      continue;
    }
    if (absl::Status s = SetFlag(it->second, entry.substr(equals + 1), variable); !s.ok()) return s;
  }
  if (!unknown.empty() && warnings != nullptr) {
    warnings->push_back(absl::StrCat("ignoring ", absl::StrJoin(unknown, ", "),
                                     ": no flag of this program has that name (--help lists them)"));
  }
  return ParseArguments(args);
}

void ParseProgramFlags(const char* usage, const char* own_flags_file, int* argc, char*** argv) {
  gflags::SetUsageMessage(usage);
  gflags::SetVersionString(VersionString());
  std::string program = (*argc > 0) ? (*argv)[0] : "tessera";
  program = program.substr(program.rfind('/') + 1);
  std::vector<std::string> args;
  for (int i = 1; i < *argc; ++i) args.emplace_back((*argv)[i]);
  for (const std::string& arg : args) {
    if (arg == "--") break;
    if (arg == "--helpfull" || arg == "-helpfull") {
      gflags::ShowUsageWithFlags((*argv)[0]);
      std::exit(0);
    }
    // --help, and gflags' other help flags (--helpshort, --helpxml, --helpmatch=S, ...), which this parser does
    // not implement: only this program's own flags, not every library's.
    if (arg == "-h" || absl::StartsWith(arg, "--help") || absl::StartsWith(arg, "-help")) {
      gflags::ShowUsageWithFlagsRestrict((*argv)[0], own_flags_file);
      std::cout << "\nEvery flag may also be set by an environment variable: TESSERA_ and its name in upper case "
                   "(--port: TESSERA_PORT); a flag on the command line wins.\n";
      std::exit(0);
    }
    if (arg == "--version" || arg == "-version") {
      std::cout << program << " " << VersionString() << std::endl;
      std::exit(0);
    }
  }
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) environment.emplace_back(*entry);
  std::vector<std::string> warnings;
  const absl::Status status = ParseProgramFlagsFrom(own_flags_file, std::move(args), environment, &warnings);
  for (const std::string& warning : warnings) std::cerr << program << ": warning: " << warning << std::endl;
  if (!status.ok()) {
    std::cerr << program << ": " << status.message() << std::endl;
    std::exit(2);
  }
  *argc = 1;  // everything was a flag
}

FlagRule AtLeastFlag(const std::string& name, int64_t minimum, const std::string& meaning) {
  return {name, [minimum, meaning](int64_t value) { return value >= minimum ? std::string() : meaning; }};
}

FlagRule PortFlag(const std::string& name, bool off_allowed) {
  return {name, [off_allowed](int64_t value) { return PortProblem(value, off_allowed); }};
}

absl::Status CheckPortOption(std::string_view flag, int64_t port, bool off_allowed) {
  const std::string problem = PortProblem(port, off_allowed);
  if (problem.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(std::string(flag), "=", port, ": ", problem));
}

FlagRule PositiveFlag(const std::string& name) { return AtLeastFlag(name, 1, "must be > 0"); }

FlagRule NonNegativeFlag(const std::string& name) { return AtLeastFlag(name, 0, "must be >= 0"); }

absl::Status CheckFlagRules(const std::vector<FlagRule>& rules) {
  for (const FlagRule& rule : rules) {
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(rule.name.c_str(), &info)) {
      return absl::InternalError(absl::StrCat("no flag --", rule.name, " to check"));
    }
    int64_t value = 0;
    double real = 0;
    if (!absl::SimpleAtoi(info.current_value, &value)) {
      if (!absl::SimpleAtod(info.current_value, &real)) {
        return absl::InternalError(absl::StrCat("--", rule.name, " is not a number"));
      }
      value = real > 0 && real < 1 ? 1 : static_cast<int64_t>(real);  // a positive fraction counts as > 0
    }
    const std::string problem = rule.check(value);
    if (problem.empty()) continue;
    auto origin = FlagOrigins().find(rule.name);
    return absl::InvalidArgumentError(
        absl::StrCat("--", rule.name, "=", info.current_value,
                     origin == FlagOrigins().end() ? " (the default)" : absl::StrCat(" (", origin->second, ")"),
                     ": ", problem));
  }
  return absl::OkStatus();
}

void CheckFlags(const std::vector<FlagRule>& rules) {
  if (absl::Status status = CheckFlagRules(rules); !status.ok()) {
    std::cerr << gflags::ProgramInvocationShortName() << ": " << status.message() << std::endl;
    std::exit(2);
  }
}

}  // namespace tessera
