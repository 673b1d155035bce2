#include "deploy/launcher/credentials.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/child_process.h"

namespace tessera {
namespace {

// Runs `openssl args...` with its output in `log`; FAILED_PRECONDITION naming the command when it fails.
absl::Status RunOpenssl(const std::vector<std::string>& args, const std::string& log) {
  const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log_fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot write ", log, ": ", strerror(errno)));
  ChildOptions child;
  child.argv = {"openssl"};
  child.argv.insert(child.argv.end(), args.begin(), args.end());
  child.stdout_fd = child.stderr_fd = log_fd;
  child.own_process_group = false;  // a Ctrl-C at the terminal stops it with the launcher
  absl::StatusOr<int> ended = RunChild(child);
  close(log_fd);
  if (!ended.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot run openssl (", ended.status().message(),
                                                      "); install Debian's openssl package"));
  }
  const int status = *ended;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("openssl ", absl::StrJoin(args, " "), " failed; see ", log));
  }
  return absl::OkStatus();
}

absl::Status WriteFile(const std::string& path, const std::string& contents, mode_t mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  const bool ok = write(fd, contents.data(), contents.size()) == static_cast<ssize_t>(contents.size());
  fchmod(fd, mode);
  close(fd);
  if (!ok) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

bool IsIpAddress(const std::string& host) {
  return host.find(':') != std::string::npos ||
         host.find_first_not_of("0123456789.") == std::string::npos;
}

}  // namespace

absl::StatusOr<CertificatePaths> MakeCertificateAuthority(const std::string& dir, const std::string& name) {
  CertificatePaths ca;
  ca.ca = absl::StrCat(dir, "/", name, "-ca.pem");
  ca.ca_key = absl::StrCat(dir, "/", name, "-ca.key");
  const std::string log = absl::StrCat(dir, "/openssl.log");
  if (absl::Status s = RunOpenssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                   "-nodes", "-keyout", ca.ca_key, "-out", ca.ca, "-days", "3650", "-subj",
                                   absl::StrCat("/CN=Tessera ", name, " CA"), "-addext",
                                   "basicConstraints=critical,CA:TRUE", "-addext",
                                   "keyUsage=critical,keyCertSign,cRLSign"},
                                  log);
      !s.ok()) {
    return s;
  }
  chmod(ca.ca_key.c_str(), 0600);
  return ca;
}

absl::Status SignCertificate(const CertificatePaths& authority, const std::string& dir, const std::string& name,
                             const std::vector<std::string>& hosts, int days, CertificatePaths* out) {
  out->ca = authority.ca;
  out->ca_key = authority.ca_key;
  out->cert = absl::StrCat(dir, "/", name, ".pem");
  out->key = absl::StrCat(dir, "/", name, ".key");
  const std::string csr = absl::StrCat(dir, "/", name, ".csr");
  const std::string ext = absl::StrCat(dir, "/", name, ".ext");
  const std::string log = absl::StrCat(dir, "/openssl.log");
  std::vector<std::string> names;
  for (const std::string& h : hosts) names.push_back(absl::StrCat(IsIpAddress(h) ? "IP:" : "DNS:", h));
  if (absl::Status s = WriteFile(ext,
                                 absl::StrCat("subjectAltName=", absl::StrJoin(names, ","),
                                              "\nextendedKeyUsage=serverAuth,clientAuth\n"
                                              "basicConstraints=CA:FALSE\n"),
                                 0600);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = RunOpenssl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                                   "-keyout", out->key, "-out", csr, "-subj", absl::StrCat("/CN=", name)},
                                  log);
      !s.ok()) {
    return s;
  }
  chmod(out->key.c_str(), 0600);
  if (absl::Status s = RunOpenssl({"x509", "-req", "-in", csr, "-CA", authority.ca, "-CAkey", authority.ca_key,
                                   "-CAcreateserial", "-out", out->cert, "-days", std::to_string(days), "-extfile",
                                   ext},
                                  log);
      !s.ok()) {
    return s;
  }
  std::filesystem::remove(csr);
  std::filesystem::remove(ext);
  return absl::OkStatus();
}

absl::StatusOr<SecurityOptions> MakeRunCredentials(const std::string& dir, bool tls) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  chmod(dir.c_str(), 0700);
  SecurityOptions options;
  options.token_file = dir + "/token";
  if (absl::Status s = WriteFile(options.token_file, NewSecret() + NewSecret() + "\n", 0600); !s.ok()) return s;
  if (!tls) return options;
  absl::StatusOr<CertificatePaths> ca = MakeCertificateAuthority(dir, "run");
  if (!ca.ok()) return ca.status();
  char hostname[256] = {0};
  gethostname(hostname, sizeof(hostname) - 1);
  std::vector<std::string> hosts = {"localhost", "127.0.0.1", "::1"};
  if (hostname[0] != '\0' && !absl::EqualsIgnoreCase(hostname, "localhost")) hosts.push_back(hostname);
  CertificatePaths node;
  if (absl::Status s = SignCertificate(*ca, dir, "node", hosts, 30, &node); !s.ok()) return s;
  options.tls_cert = node.cert;
  options.tls_key = node.key;
  options.tls_ca = node.ca;
  return options;
}

}  // namespace tessera
