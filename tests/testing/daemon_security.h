// The security flags every daemon a test starts gets alike: the job token, and mutual TLS with a fresh
// certificate authority and one certificate for 127.0.0.1 and localhost (tests linking tessera_launcher, which
// makes them).
//
//   absl::StatusOr<DaemonSecurity> security = DaemonSecurity::Make(dir_.string(), "early", token_file, /*tls=*/true);
//   Subprocess server(security->On({kBin + "/tessera-server", "--scheduler=" + address}));
#ifndef TESSERA_TESTS_TESTING_DAEMON_SECURITY_H_
#define TESSERA_TESTS_TESTING_DAEMON_SECURITY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deploy/launcher/credentials.h"

namespace tessera::testing {

struct DaemonSecurity {
  // `token_file`: empty for none; with `tls`, the certificates are made in `dir`, named after `name`.
  static absl::StatusOr<DaemonSecurity> Make(const std::string& dir, const std::string& name,
                                             const std::string& token_file, bool tls) {
    DaemonSecurity security;
    if (!token_file.empty()) security.flags.push_back("--token_file=" + token_file);
    if (!tls) return security;
    absl::StatusOr<CertificatePaths> ca = MakeCertificateAuthority(dir, name);
    if (!ca.ok()) return ca.status();
    CertificatePaths node;
    if (absl::Status s = SignCertificate(*ca, dir, name + "-node", {"127.0.0.1", "localhost"}, 1, &node); !s.ok()) {
      return s;
    }
    security.flags.insert(security.flags.end(),
                          {"--tls_cert=" + node.cert, "--tls_key=" + node.key, "--tls_ca=" + ca->ca});
    return security;
  }

  // `argv` with the flags added.
  std::vector<std::string> On(std::vector<std::string> argv) const {
    argv.insert(argv.end(), flags.begin(), flags.end());
    return argv;
  }

  std::vector<std::string> flags;
};

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_DAEMON_SECURITY_H_
