// The security flags every Tessera binary takes. Expand TESSERA_DEFINE_SECURITY_FLAGS() once, at namespace
// scope in the binary's *_main.cc (so that --help lists them with the binary's own flags), then read them with
// SecurityFlags().
#ifndef TESSERA_COMMON_RPC_SECURITY_FLAGS_H_
#define TESSERA_COMMON_RPC_SECURITY_FLAGS_H_

#include "common/rpc/security.h"
#include "gflags/gflags.h"

#define TESSERA_DEFINE_SECURITY_FLAGS()                                                                            \
  DEFINE_string(tls_cert, "", "PEM certificate (chain) of this process: with --tls_key, gRPC and HTTP use TLS");    \
  DEFINE_string(tls_key, "", "PEM private key of --tls_cert");                                                     \
  DEFINE_string(tls_ca, "",                                                                                        \
                "PEM CA bundle that peers' certificates must chain to; with it on both sides TLS is mutual");      \
  DEFINE_string(token_file, "",                                                                                    \
                "file holding the job's token (first line); every RPC must carry it. Never give the token "        \
                "itself on a command line");                                                                       \
  DEFINE_bool(insecure, false, "allow plaintext (no --tls_cert) on a non-loopback address");                       \
  static tessera::SecurityOptions SecurityFlags() {                                                                \
    tessera::SecurityOptions options;                                                                              \
    options.tls_cert = FLAGS_tls_cert;                                                                             \
    options.tls_key = FLAGS_tls_key;                                                                               \
    options.tls_ca = FLAGS_tls_ca;                                                                                 \
    options.token_file = FLAGS_token_file;                                                                         \
    options.insecure = FLAGS_insecure;                                                                             \
    return options;                                                                                                \
  }

#endif  // TESSERA_COMMON_RPC_SECURITY_FLAGS_H_
