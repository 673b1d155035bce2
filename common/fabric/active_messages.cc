#include "common/fabric/active_messages.h"

#include "absl/strings/str_cat.h"
#include "common/fabric/ucx_worker.h"
#include "common/base/status_macros.h"

namespace tessera {
namespace {

// What an nbx call returned: done at once (null), failed at once, or in flight (the request, for cancelling).
void* Track(ucs_status_ptr_t request, UcxRequestState* state, const char* what) {
  if (request == nullptr) {
    state->owner->Complete(state, UCS_OK, what);
    return nullptr;
  }
  if (UCS_PTR_IS_ERR(request)) {
    state->owner->Complete(state, UCS_PTR_STATUS(request), what);
    return nullptr;
  }
  return request;
}

}  // namespace

void* SendActiveMessage(UcxWorker& worker, ucp_ep_h ep, FabricMessage id, std::string header, const void* data,
                        size_t length, std::shared_ptr<const void> keep,
                        std::function<void(const absl::Status&)> on_sent) {
  UcxRequestState* f = worker.Hold(std::move(header), std::move(keep), std::move(on_sent));
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;  // the receiver answers on the endpoint the message came from
  param.user_data = f;
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    auto* state = static_cast<UcxRequestState*>(user_data);
    state->owner->Complete(state, status, "UCX send");
    ucp_request_free(request);
  };
  return Track(ucp_am_send_nbx(ep, id, f->header.data(), f->header.size(), data, data == nullptr ? 0 : length, &param),
               f, "UCX send");
}

void* ReceiveActiveMessageData(UcxWorker& worker, void* desc, void* dst, size_t length,
                               std::function<void(const absl::Status&)> on_received) {
  UcxRequestState* f = worker.Hold({}, nullptr, std::move(on_received));
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.user_data = f;
  param.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
    auto* state = static_cast<UcxRequestState*>(user_data);
    state->owner->Complete(state, status, "UCX receive");
    ucp_request_free(request);
  };
  return Track(ucp_am_recv_data_nbx(worker.worker(), desc, dst, length, &param), f, "UCX receive");
}

tessera::v1::FabricReply ReplyWithStatus(uint64_t request_id, const absl::Status& status) {
  tessera::v1::FabricReply reply;
  reply.set_request_id(request_id);
  reply.set_code(static_cast<int>(status.code()));
  reply.set_message(std::string(status.message()));
  if (std::optional<uint64_t> epoch = GetCurrentEpoch(status)) reply.set_current_epoch(*epoch);
  return reply;
}

absl::Status StatusOfReply(const tessera::v1::FabricReply& reply, std::string_view what) {
  if (reply.code() == 0) return absl::OkStatus();
  const int code = reply.code() > 0 && reply.code() <= static_cast<int>(absl::StatusCode::kUnauthenticated)
                       ? reply.code()
                       : static_cast<int>(absl::StatusCode::kUnknown);
  absl::Status status(static_cast<absl::StatusCode>(code), absl::StrCat(std::string(what), ": ", reply.message()));
  if (reply.current_epoch() > 0) SetCurrentEpoch(status, reply.current_epoch());
  return status;
}

}  // namespace tessera
