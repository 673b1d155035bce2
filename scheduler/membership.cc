#include "scheduler/membership.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {

absl::StatusOr<int> Membership::Add(const tessera::v1::RegisterRequest& request, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Member member;
  member.role = request.role();
  member.address = request.address();
  member.hostname = request.hostname();
  member.device = request.device();
  member.last_seen = now;
  if (request.role() == tessera::v1::SERVER) {
    if (request.address().empty()) return absl::InvalidArgumentError("a server must register with its address");
    if (static_cast<int>(servers_.size()) >= num_servers_) {
      return absl::ResourceExhaustedError(absl::StrCat("the job has all its ", num_servers_,
                                                       " servers; server at ", request.address(), " is not needed"));
    }
    member.id = static_cast<int>(servers_.size());
    servers_.push_back(member);
    return member.id;
  }
  if (request.role() == tessera::v1::WORKER) {
    if (static_cast<int>(workers_.size()) >= num_workers_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the job has all its ", num_workers_, " workers; no rank left for ", request.hostname()));
    }
    member.id = static_cast<int>(workers_.size());
    workers_.push_back(member);
    return member.id;
  }
  return absl::InvalidArgumentError("register: role must be SERVER or WORKER");
}

absl::Status Membership::Touch(tessera::v1::Role role, int id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<Member>& members = role == tessera::v1::SERVER ? servers_ : workers_;
  if (id < 0 || id >= static_cast<int>(members.size())) {
    return absl::NotFoundError(absl::StrCat("no ", tessera::v1::Role_Name(role), " with id ", id, " registered"));
  }
  members[id].last_seen = now;
  return absl::OkStatus();
}

std::vector<int> Membership::SilentWorkers(absl::Time now, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  std::vector<int> silent;
  for (const Member& w : workers_) {
    if (now - w.last_seen > timeout) silent.push_back(w.id);
  }
  return silent;
}

void Membership::SetWorkerDevice(int id, const std::string& device) {
  absl::MutexLock lock(&mu_);
  if (id >= 0 && id < static_cast<int>(workers_.size())) workers_[id].device = device;
}

std::vector<Member> Membership::Servers() const {
  absl::MutexLock lock(&mu_);
  return servers_;
}

std::vector<Member> Membership::Workers() const {
  absl::MutexLock lock(&mu_);
  return workers_;
}

std::string Membership::WaitingSummary(absl::Time now, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  const int missing_servers = num_servers_ - static_cast<int>(servers_.size());
  const int missing_workers = num_workers_ - static_cast<int>(workers_.size());
  if (missing_servers <= 0 && missing_workers <= 0) return "";
  auto count = [](int n, const char* one, const char* many) { return absl::StrCat(n, " more ", n == 1 ? one : many); };
  std::vector<std::string> missing;
  if (missing_servers > 0) missing.push_back(count(missing_servers, "server", "servers"));
  if (missing_workers > 0) missing.push_back(count(missing_workers, "worker", "workers"));
  std::string text = absl::StrCat("waiting for ", absl::StrJoin(missing, " and "));
  auto describe = [&](const Member& m, const char* role) {
    const int64_t seconds = absl::ToInt64Seconds(now - m.last_seen);
    const std::string where = m.address.empty() ? (m.hostname.empty() ? "" : " on " + m.hostname) : " at " + m.address;
    absl::StrAppend(&text, "; ", role, " ", m.id, where, now - m.last_seen > timeout ? " lost, last heard " : " last heard ",
                    seconds, " s ago");
  };
  for (const Member& m : servers_) describe(m, "server");
  for (const Member& m : workers_) describe(m, "worker");
  return text;
}

bool Membership::AllServersRegistered() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(servers_.size()) == num_servers_;
}

}  // namespace tessera
