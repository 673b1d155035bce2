#include "deploy/launcher/cpu_quota.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tessera {
namespace {

constexpr char kPrefix[] = "tessera-";

// Where groups with a CPU quota can be made: the hierarchy's version and this process's own group in it.
struct QuotaRoot {
  int version = 0;
  std::string dir;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool WriteFile(const std::string& path, const std::string& text, std::string* error) {
  std::ofstream out(path);
  out << text;
  out.flush();
  if (out) return true;
  *error = absl::StrCat("cannot write ", text, " to ", path, ": ", strerror(errno));
  return false;
}

bool HasWord(absl::string_view list, absl::string_view word, char separator) {
  for (absl::string_view w : absl::StrSplit(list, absl::ByAnyChar(std::string(1, separator) + " \n"), absl::SkipEmpty())) {
    if (w == word) return true;
  }
  return false;
}

// This process's group in the hierarchy `mount` (a path below it), or the mount itself when that path is not
// there (a container that sees only its own part of the hierarchy).
std::string OwnGroup(const std::string& mount, const std::string& own_path) {
  const std::string dir = mount + (own_path == "/" ? "" : own_path);
  return std::filesystem::is_directory(dir) ? dir : mount;
}

// cgroup v2 with the cpu controller delegated to this process's group, else cgroup v1's cpu hierarchy.
// FAILED_PRECONDITION naming each place tried and why it cannot be used.
absl::StatusOr<QuotaRoot> FindQuotaRoot() {
  std::string v2_mount, v1_mount;
  {
    std::ifstream mounts("/proc/self/mounts");
    for (std::string line; std::getline(mounts, line);) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      if (f.size() < 4) continue;
      if (f[2] == "cgroup2" && v2_mount.empty()) v2_mount = f[1];
      if (f[2] == "cgroup" && v1_mount.empty() && HasWord(f[3], "cpu", ',')) v1_mount = f[1];
    }
  }
  std::string v2_path = "/", v1_path = "/";
  {
    std::ifstream groups("/proc/self/cgroup");
    for (std::string line; std::getline(groups, line);) {
      std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
      if (f.size() != 3) continue;
      if (f[0] == "0" && f[1].empty()) v2_path = f[2];
      if (HasWord(f[1], "cpu", ',')) v1_path = f[2];
    }
  }
  std::vector<std::string> tried;
  if (!v2_mount.empty()) {
    const std::string dir = OwnGroup(v2_mount, v2_path);
    if (!HasWord(ReadFile(dir + "/cgroup.subtree_control"), "cpu", ' ')) {
      tried.push_back(absl::StrCat("cgroup v2 at ", dir, " does not give its child groups the cpu controller (",
                                   dir, "/cgroup.subtree_control has no \"cpu\")"));
    } else if (access(dir.c_str(), W_OK) != 0) {
      tried.push_back(absl::StrCat("cgroup v2 at ", dir, " is not writable: ", strerror(errno)));
    } else {
      return QuotaRoot{2, dir};
    }
  } else {
    tried.push_back("no cgroup v2 hierarchy is mounted");
  }
  if (!v1_mount.empty()) {
    const std::string dir = OwnGroup(v1_mount, v1_path);
    if (!std::filesystem::exists(dir + "/cpu.cfs_quota_us")) {
      tried.push_back(absl::StrCat("cgroup v1's cpu hierarchy at ", dir, " has no cpu.cfs_quota_us (a kernel "
                                   "without CFS bandwidth control)"));
    } else if (access(dir.c_str(), W_OK) != 0) {
      tried.push_back(absl::StrCat("cgroup v1's cpu hierarchy at ", dir, " is not writable (", strerror(errno),
                                   "; it needs root, or a group delegated to this user)"));
    } else {
      return QuotaRoot{1, dir};
    }
  } else {
    tried.push_back("no cgroup v1 cpu hierarchy is mounted");
  }
  return absl::FailedPreconditionError(
      absl::StrCat("CPU quotas need a control group with a writable CPU controller, and none is here: ",
                   absl::StrJoin(tried, "; ")));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuQuotaGroup>> CpuQuotaGroup::Create(const std::string& name) {
  absl::StatusOr<QuotaRoot> root = FindQuotaRoot();
  if (!root.ok()) return root.status();
  const std::string path = absl::StrCat(root->dir, "/", kPrefix, getpid(), "-", name);
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat("CPU quotas: cannot make the control group ", path, ": ",
                                                      strerror(errno)));
  }
  return std::unique_ptr<CpuQuotaGroup>(new CpuQuotaGroup(root->version, path));
}

absl::Status CpuQuotaGroup::Available() {
  absl::StatusOr<std::unique_ptr<CpuQuotaGroup>> probe = Create("probe");
  if (!probe.ok()) return probe.status();
  return (*probe)->SetCpus(0.5);
}

void CpuQuotaGroup::RemoveLeftovers() {
  absl::StatusOr<QuotaRoot> root = FindQuotaRoot();
  if (!root.ok()) return;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root->dir, error)) {
    std::string name = entry.path().filename().string();
    absl::string_view rest = name;
    if (!entry.is_directory() || !absl::ConsumePrefix(&rest, kPrefix)) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(rest.substr(0, rest.find('-')), &pid) || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // its launcher still runs
    rmdir(entry.path().c_str());  // fails, and leaves it, while processes are in it
  }
}

CpuQuotaGroup::~CpuQuotaGroup() {
  // A process that just exited leaves its group a moment later.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (rmdir(path_.c_str()) != 0 && errno == EBUSY && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

absl::Status CpuQuotaGroup::SetCpus(double cpus) {
  if (!std::isfinite(cpus) || cpus < 0 || (cpus > 0 && cpus < kMinCpus)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CPU quota is a number of CPUs, at least ", kMinCpus, " (or 0: no quota); got ", cpus));
  }
  const int64_t period_us =
      cpus > 0 ? std::clamp<int64_t>(std::llround(std::ceil(kMinQuotaUs / cpus)), kPeriodUs, kMaxPeriodUs) : kPeriodUs;
  const int64_t quota_us = cpus > 0 ? std::max<int64_t>(kMinQuotaUs, std::llround(cpus * period_us)) : -1;
  std::string error;
  bool ok;
  if (version_ == 2) {
    ok = WriteFile(path_ + "/cpu.max",
                   absl::StrCat(quota_us > 0 ? absl::StrCat(quota_us) : std::string("max"), " ", period_us), &error);
  } else {
    // The quota goes first when it shrinks (a quota longer than the period is allowed, the reverse order could
    // leave neither written): -1, then the period, then the quota.
    ok = WriteFile(path_ + "/cpu.cfs_quota_us", "-1", &error) &&
         WriteFile(path_ + "/cpu.cfs_period_us", absl::StrCat(period_us), &error) &&
         (quota_us < 0 || WriteFile(path_ + "/cpu.cfs_quota_us", absl::StrCat(quota_us), &error));
  }
  if (!ok) return absl::FailedPreconditionError(absl::StrCat("CPU quotas: ", error));
  cpus_ = cpus;
  return absl::OkStatus();
}

std::string CpuQuotaGroup::Describe() const { return absl::StrCat("cgroup v", version_, " ", path_); }

absl::StatusOr<std::vector<double>> ParseCpuQuotas(absl::string_view text) {
  std::vector<double> cpus;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    double value = 0;
    if (entry != "none" && (!absl::SimpleAtod(entry, &value) || !std::isfinite(value) || value < 0 ||
                            (value > 0 && value < CpuQuotaGroup::kMinCpus))) {
      return absl::InvalidArgumentError(absl::StrCat("a CPU quota is a number of CPUs per worker, at least ",
                                                     CpuQuotaGroup::kMinCpus,
                                                     ", or 0 or none for no quota (e.g. 1,0.25); got \"", entry,
                                                     "\" in \"", text, "\""));
    }
    cpus.push_back(value);
  }
  return cpus;
}

absl::StatusOr<std::vector<CpuQuotaChange>> ParseCpuQuotaChanges(absl::string_view text) {
  std::vector<CpuQuotaChange> changes;
  for (absl::string_view part : absl::StrSplit(text, ';', absl::SkipWhitespace())) {
    std::vector<absl::string_view> halves = absl::StrSplit(part, absl::MaxSplits(':', 1));
    CpuQuotaChange change;
    if (halves.size() != 2 || !absl::SimpleAtod(absl::StripAsciiWhitespace(halves[0]), &change.after_seconds) ||
        !std::isfinite(change.after_seconds) || change.after_seconds < 0) {
      return absl::InvalidArgumentError(absl::StrCat("a change of the CPU quotas is SECONDS:QUOTAS (e.g. 30:1,0.25; ",
                                                     "several separated by ;); got \"", part, "\""));
    }
    absl::StatusOr<std::vector<double>> cpus = ParseCpuQuotas(halves[1]);
    if (!cpus.ok()) return cpus.status();
    change.cpus = *std::move(cpus);
    if (!changes.empty() && change.after_seconds <= changes.back().after_seconds) {
      return absl::InvalidArgumentError(absl::StrCat("the changes of the CPU quotas must come in increasing time; \"",
                                                     part, "\" comes after ", changes.back().after_seconds, " s"));
    }
    changes.push_back(std::move(change));
  }
  return changes;
}

}  // namespace tessera
