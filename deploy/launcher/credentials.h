// A run's credentials, made fresh by the launcher: the job token, and when asked, a certificate authority and a
// certificate for the daemons (OpenSSL's command line tool, Debian's `openssl`).
//
//   TESSERA_ASSIGN_OR_RETURN(SecurityOptions security, MakeRunCredentials(run_dir + "/secrets", /*tls=*/true));
//   // security.token_file, .tls_cert, .tls_key, .tls_ca: hand them to every daemon as --token_file=... etc.
#ifndef TESSERA_DEPLOY_LAUNCHER_CREDENTIALS_H_
#define TESSERA_DEPLOY_LAUNCHER_CREDENTIALS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/security.h"

namespace tessera {

// Writes `dir`/token (a new random token, mode 0600) and, with `tls`, `dir`/ca.pem, `dir`/node.pem and
// `dir`/node.key: a CA made for this run and one certificate it signed, valid for localhost, 127.0.0.1, ::1
// and this host's name, used by every daemon as server and client (mutual TLS). `dir` is created (0700).
[[nodiscard]] absl::StatusOr<SecurityOptions> MakeRunCredentials(const std::string& dir, bool tls);

// Certificates for tests and for users who want their own: a CA in `dir`/`name`-ca.pem (+ .key), and with
// it a certificate `dir`/`name`.pem (+ .key) for `hosts` (DNS names or IP addresses), valid for `days` days
// (0: already expired when made).
struct CertificatePaths {
  std::string ca;
  std::string ca_key;
  std::string cert;
  std::string key;
};
[[nodiscard]] absl::StatusOr<CertificatePaths> MakeCertificateAuthority(const std::string& dir,
                                                                       const std::string& name);
[[nodiscard]] absl::Status SignCertificate(const CertificatePaths& authority, const std::string& dir,
                                           const std::string& name, const std::vector<std::string>& hosts,
                                           int days, CertificatePaths* out);

}  // namespace tessera

#endif  // TESSERA_DEPLOY_LAUNCHER_CREDENTIALS_H_
