// Chunk calls over gRPC: the default transport, the only one for an untrusted network (TLS and the job token
// when the job has them). One unary call per chunk over gRPC's callback API with raw byte buffers: a push's
// values go from the caller's memory to the socket as a slice of their own, and a reply's values are decoded
// on gRPC's threads straight into the destination (common/rpc/wire_payload.h).
#ifndef TESSERA_WORKER_CLIENT_GRPC_CHUNK_TRANSPORT_H_
#define TESSERA_WORKER_CLIENT_GRPC_CHUNK_TRANSPORT_H_

#include <grpcpp/generic/generic_stub.h>

#include <memory>

#include "common/rpc/rpc.h"
#include "common/rpc/security.h"
#include "worker/client/chunk_transport.h"

namespace tessera {

class GrpcChunkTransport final : public ChunkTransport {
 public:
  // `connections_per_server` TCP connections to each server; a chunk's calls take the one of its index.
  GrpcChunkTransport(std::shared_ptr<const Security> security, int connections_per_server);

  const char* name() const override { return "grpc"; }
  absl::Status Prepare(ChunkCall& call, const CallerIdentity& who) override;
  void Start(ChunkCall* call, std::function<void()> done) override;
  void Cancel(ChunkCall* call) override;

 private:
  const std::shared_ptr<const Security> security_;
  const int connections_per_server_;
  StubCache<grpc::GenericStub> stubs_;  // by address and lane: a connection each
};

}  // namespace tessera

#endif  // TESSERA_WORKER_CLIENT_GRPC_CHUNK_TRANSPORT_H_
