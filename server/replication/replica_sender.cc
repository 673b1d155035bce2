#include "server/replication/replica_sender.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace tessera {

GrpcReplicaSender::GrpcReplicaSender(std::shared_ptr<const Security> security, absl::Duration timeout,
                                     std::shared_ptr<const ReplicaSigner> signer)
    : timeout_(timeout),
      security_(security),
      signer_(std::move(signer)),
      stubs_(std::move(security), [](std::shared_ptr<grpc::Channel> channel) {
        return tessera::v1::ParameterServer::NewStub(std::move(channel));
      }) {}

void GrpcReplicaSender::Send(const ReplicaTarget& backup,
                             std::shared_ptr<const tessera::v1::ReplicateRequest> request,
                             std::function<void(absl::StatusOr<int64_t>)> done) {
  struct Call {
    grpc::ClientContext context;
    tessera::v1::ReplicateResponse response;
    std::shared_ptr<const tessera::v1::ReplicateRequest> request;
    std::function<void(absl::StatusOr<int64_t>)> done;
  };
  auto* call = new Call;
  call->request = std::move(request);
  call->done = std::move(done);
  SetTimeout(call->context, timeout_);
  security_->Authorize(call->context);
  // Signed for this backup only: another server cannot take it as its own, and the backup learns no secret.
  call->context.AddMetadata(
      kReplicaSignatureHeader,
      signer_->Sign(ReplicateProof(ReplicateDigest(*call->request), backup.server_id, backup.incarnation)));
  const std::string what = absl::StrCat("Replicate ", call->request->state().param(), "/",
                                        call->request->state().index(), " to server ", backup.server_id, " at ",
                                        backup.address);
  stubs_.Get(backup.address)
      ->async()
      ->Replicate(&call->context, call->request.get(), &call->response, [call, what](grpc::Status status) {
        absl::Status answered = FromGrpcStatus(status, call->context, what);
        if (answered.ok()) {
          call->done(call->response.version());
        } else {
          call->done(answered);
        }
        delete call;
      });
}

}  // namespace tessera
