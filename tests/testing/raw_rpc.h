// Calls any Tessera method with bytes and metadata of the test's choosing, the way a client built from proto/
// alone (or a hostile one) would.
//
//   absl::Status s = RawUnary(channel, "/tessera.v1.Scheduler/Heartbeat", "\xff\xff", {{"authorization", "x"}});
#ifndef TESSERA_TESTS_TESTING_RAW_RPC_H_
#define TESSERA_TESTS_TESTING_RAW_RPC_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/rpc.h"
#include "google/protobuf/message.h"

namespace tessera::testing {

using Metadata = std::vector<std::pair<std::string, std::string>>;

// One unary call of `method` ("/package.Service/Method") carrying `bytes`; the reply's bytes go to `response`.
inline absl::Status RawUnary(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                             const std::string& bytes, const Metadata& metadata = {},
                             std::string* response = nullptr, absl::Duration timeout = absl::Seconds(10)) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  SetTimeout(context, timeout);
  for (const auto& [key, value] : metadata) context.AddMetadata(key, value);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer reply;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &reply, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  if (status.ok() && response != nullptr) {
    std::vector<grpc::Slice> slices;
    (void)reply.Dump(&slices);
    response->clear();
    for (const auto& s : slices) response->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return FromGrpcStatus(status, context, method);
}

// The same with a message.
inline absl::Status RawUnary(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                             const google::protobuf::Message& message, const Metadata& metadata = {},
                             google::protobuf::Message* response = nullptr,
                             absl::Duration timeout = absl::Seconds(10)) {
  std::string reply;
  absl::Status status = RawUnary(channel, method, message.SerializeAsString(), metadata, &reply, timeout);
  if (status.ok() && response != nullptr && !response->ParseFromString(reply)) {
    return absl::InternalError("unparsable reply");
  }
  return status;
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_RAW_RPC_H_
