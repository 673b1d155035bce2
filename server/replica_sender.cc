#include "server/replica_sender.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace tessera {

GrpcReplicaSender::GrpcReplicaSender(std::shared_ptr<const Security> security, absl::Duration timeout)
    : timeout_(timeout), security_(security), stubs_(std::move(security), [](std::shared_ptr<grpc::Channel> channel) {
        return tessera::v1::ParameterServer::NewStub(std::move(channel));
      }) {}

void GrpcReplicaSender::set_member_key(std::string key) {
  absl::MutexLock lock(&mu_);
  member_key_ = std::move(key);
}

void GrpcReplicaSender::Send(const std::string& address, std::shared_ptr<const tessera::v1::ReplicateRequest> request,
                             std::function<void(absl::Status)> done) {
  struct Call {
    grpc::ClientContext context;
    tessera::v1::ReplicateResponse response;
    std::shared_ptr<const tessera::v1::ReplicateRequest> request;
    std::function<void(absl::Status)> done;
  };
  auto* call = new Call;
  call->request = std::move(request);
  call->done = std::move(done);
  SetTimeout(call->context, timeout_);
  security_->Authorize(call->context);
  {
    absl::MutexLock lock(&mu_);
    call->context.AddMetadata(kMemberKeyHeader, member_key_);
  }
  const std::string what = absl::StrCat("Replicate ", call->request->state().param(), "/",
                                       call->request->state().index(), " to ", address);
  stubs_.Get(address)->async()->Replicate(&call->context, call->request.get(), &call->response,
                                          [call, what](grpc::Status status) {
                                            call->done(FromGrpcStatus(status, call->context, what));
                                            delete call;
                                          });
}

}  // namespace tessera
