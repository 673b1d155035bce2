// What a daemon or client is told about security on its command line: the TLS files, the job token's file, and
// whether plaintext is allowed off loopback (common/rpc/security.h loads and applies them). Transport-free, so a
// client library's API can take them without including gRPC.
#ifndef TESSERA_COMMON_RPC_SECURITY_OPTIONS_H_
#define TESSERA_COMMON_RPC_SECURITY_OPTIONS_H_

#include <string>

namespace tessera {

// What a daemon or client is told on its command line (every daemon has these flags).
struct SecurityOptions {
  std::string tls_cert;    // PEM certificate chain of this process (with tls_key: TLS on)
  std::string tls_key;     // PEM private key
  std::string tls_ca;      // PEM CA bundle: verifies peers; a server with one asks clients for certificates (mTLS)
  std::string token_file;  // the job token (first line, surrounding whitespace dropped)
  bool insecure = false;   // allow plaintext on a non-loopback address
};

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_SECURITY_OPTIONS_H_
